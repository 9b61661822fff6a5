"""The arithmetic of ``benchmarks/api.py``, apart from any process: latencies summed up,
what HTTP adds, the rounds' rates and ratios, the goals judged, and the rows of its
tables (printed at the end of a run and shown on its docs page)."""
from __future__ import annotations

import statistics
from typing import Any, Mapping, Sequence

from benchmarks.common import percentile
from benchmarks.pages_kit import num, ratio

#: What HTTP may add to a submit, at the median, in milliseconds (at most).
GOAL_ADDED_P50_MS = 2.0
#: The API's submits per second against ``submit()``'s from as many processes (at least).
GOAL_RATE_RATIO = 0.5
#: The latency phase's calls, each timed one at a time, interleaved.
KINDS = ("submit", "http_submit", "http_floor", "http_models")
LATENCY_LABELS = {"submit": "`submit(..., plan=mega)` in-process",
                  "http_submit": "`POST /v1/predictions` (end to end, 201)",
                  "http_floor": "the floor: `GET /v1/predictions/{unknown}` (the key, one "
                                "Redis read, 404)",
                  "http_models": "`GET /v1/models` (the key, no Redis, every model's "
                                 "schema)"}
SIDES = ("submit", "api")
#: The throughput phase's modes: (side, processes).
MODES = (("submit", 1), ("api", 1), ("submit", 2), ("api", 2))


def mode_name(side: str, processes: int) -> str:
    """``("api", 2)`` -> ``"api x2"``."""
    return f"{side} x{processes}"


# --- latency -----------------------------------------------------------------------------
def spread(ms: Sequence[float]) -> dict[str, float | int | None]:
    """n, mean, p50, p90 and p99 of ``ms``."""
    return {"n": len(ms), "mean": statistics.fmean(ms) if ms else None,
            **{f"p{q}": percentile(ms, q / 100) for q in (50, 90, 99)}}


def latency_figures(ms: Mapping[str, Sequence[float]],
                    cpu_ms: Mapping[str, Sequence[float]]) -> dict[str, Any]:
    """Each kind's spread, with the median of the caller's own CPU in a call; what HTTP
    adds (the POST's percentile less ``submit()``'s, and the median of the per-sample
    differences); the POST over the floor."""
    spreads = {kind: {**spread(ms[kind]), "caller_cpu_p50": percentile(cpu_ms[kind], 0.5)}
               for kind in KINDS}
    post, alone, floor = spreads["http_submit"], spreads["submit"], spreads["http_floor"]
    pairs = [b - a for a, b in zip(ms["submit"], ms["http_submit"])]
    return {"ms": spreads,
            "added_ms": {"p50": post["p50"] - alone["p50"], "p99": post["p99"] - alone["p99"],
                         "paired_p50": statistics.median(pairs) if pairs else None},
            "over_floor_ms": {"p50": post["p50"] - floor["p50"],
                              "p99": post["p99"] - floor["p99"]}}


# --- throughput ----------------------------------------------------------------------------
def mode_summary(rounds: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """One mode over its rounds: submits/s (all rounds, median round), CPU µs per submit of
    the processes that submit (``submit()``'s callers, or the API's servers) and of the
    HTTP clients, Redis commands and CPU µs per submit, and the errors."""
    submits = sum(r["submits"] for r in rounds)
    per = 1e6 / submits if submits else 0.0
    commands = sum(sum(r["redis_commands"].values()) for r in rounds)
    return {"submits": submits, "submits_s": submits / sum(r["wall_s"] for r in rounds),
            "median_round_submits_s": statistics.median(r["submits_s"] for r in rounds),
            "cpu_us_per_submit": per * sum(r["submitting_cpu_s"] for r in rounds),
            "client_cpu_us_per_submit": per * sum(r.get("client_cpu_s", 0.0) for r in rounds),
            "redis_commands_per_submit": commands / submits if submits else 0.0,
            "redis_cpu_us_per_submit": per * sum(r["redis_cpu_s"] for r in rounds),
            "errors": sum(sum(r["errors"].values()) for r in rounds),
            "parked": sum(r["parked"] for r in rounds)}


def by_command(rounds: Sequence[Mapping[str, Any]]) -> dict[str, float]:
    """Redis calls per submit, by command, over ``rounds``."""
    submits = sum(r["submits"] for r in rounds) or 1
    calls: dict[str, float] = {}
    for r in rounds:
        for name, n in r["redis_commands"].items():
            calls[name] = calls.get(name, 0) + n
    return {name: n / submits for name, n in sorted(calls.items()) if n > 0}


def throughput_figures(rounds: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """Per mode its summary and Redis calls by command; per process count the API's
    rate against ``submit()``'s (all rounds, and the median of the rounds' ratios: each
    round runs every mode back to back, so a slow stretch hits both of a pair), and
    the API servers' CPU per submit against the ``submit()`` loops'."""
    of = {mode_name(*mode): [r for r in rounds if (r["side"], r["processes"]) == mode]
          for mode in MODES}
    modes = {name: mode_summary(found) for name, found in of.items() if found}
    ratios = {}
    for n in sorted({r["processes"] for r in rounds}):
        api, alone = of[mode_name("api", n)], of[mode_name("submit", n)]
        if api and alone:
            ratios[str(n)] = {
                "all_rounds": modes[mode_name("api", n)]["submits_s"]
                / modes[mode_name("submit", n)]["submits_s"],
                "paired": statistics.median(a["submits_s"] / s["submits_s"]
                                            for a, s in zip(api, alone)),
                "cpu_per_submit": modes[mode_name("api", n)]["cpu_us_per_submit"]
                / modes[mode_name("submit", n)]["cpu_us_per_submit"]}
    return {"modes": modes, "ratios": ratios,
            "redis_by_command": {name: by_command(found) for name, found in of.items()
                                 if found}}


# --- goals ------------------------------------------------------------------------------------
def verdicts(latency: Mapping[str, Any], throughput: Mapping[str, Any]) -> dict[str, Any]:
    """Each goal: its bound, the figure judged, whether it is met (reported, never
    asserted). The rate goals are judged on the paired ratios."""
    added = latency["added_ms"]["p50"]
    judged = {"added_p50_ms": {"goal": f"<= {GOAL_ADDED_P50_MS:g}", "value": added,
                               "met": added <= GOAL_ADDED_P50_MS}}
    for n, found in throughput["ratios"].items():
        judged[f"rate_ratio_x{n}"] = {"goal": f">= {GOAL_RATE_RATIO:g}",
                                      "value": found["paired"],
                                      "met": found["paired"] >= GOAL_RATE_RATIO}
    return judged


def verdict_lines(judged: Mapping[str, Mapping[str, Any]]) -> list[str]:
    """One sentence per goal."""
    lines = []
    for name, goal in judged.items():
        met = "met" if goal["met"] else "NOT met"
        if name == "added_p50_ms":
            lines.append(f"HTTP adds {goal['value']:.3f} ms to a submit at the median; "
                         f"goal {goal['goal']} ms: {met}.")
        else:
            n = name.removeprefix("rate_ratio_x")
            processes = "1 process" if n == "1" else f"{n} processes"
            lines.append(f"The API in {processes} submits at {goal['value']:.2f}x the rate "
                         f"of submit() in {processes} (median of paired rounds); goal "
                         f"{goal['goal']}x: {met}.")
    return lines


# --- rows --------------------------------------------------------------------------------------
def latency_rows(latency: Mapping[str, Any]) -> list[list[str]]:
    """what | n | p50 ms | p90 ms | p99 ms | the caller's CPU ms (p50)."""
    rows = [[LATENCY_LABELS[kind], str(s["n"]), num(s["p50"], 2), num(s["p90"], 2),
             num(s["p99"], 2), num(s.get("caller_cpu_p50"), 2)]
            for kind, s in latency["ms"].items()]
    added, over = latency["added_ms"], latency["over_floor_ms"]
    rows.append(["added by HTTP: POST less `submit()`", "", num(added["p50"], 2), "",
                 num(added["p99"], 2), ""])
    rows.append(["the POST less the floor", "", num(over["p50"], 2), "",
                 num(over["p99"], 2), ""])
    return rows


LATENCY_HEADERS = ("what", "n", "p50 ms", "p90 ms", "p99 ms", "caller CPU ms (p50)")
THROUGHPUT_HEADERS = ("mode", "submits/s", "median round", "CPU µs per submit",
                      "client CPU µs", "Redis commands", "Redis CPU µs", "errors")


def throughput_rows(throughput: Mapping[str, Any]) -> list[list[str]]:
    """A row per mode, then a row per process count with the API's ratios."""
    rows = [[name, num(m["submits_s"], 0), num(m["median_round_submits_s"], 0),
             num(m["cpu_us_per_submit"], 0),
             num(m["client_cpu_us_per_submit"], 0) if name.startswith("api") else "–",
             num(m["redis_commands_per_submit"], 1), num(m["redis_cpu_us_per_submit"], 0),
             str(m["errors"] + m["parked"])]
            for name, m in throughput["modes"].items()]
    rows += [[f"ratio api / submit, x{n}", ratio(r["all_rounds"]), f"{ratio(r['paired'])} "
              "(paired)", ratio(r["cpu_per_submit"]), "", "", "", ""]
             for n, r in throughput["ratios"].items()]
    return rows
