"""Pages of a busy pool: route hashing and cold loads, fair relax, preemption."""
from __future__ import annotations

import statistics
from typing import Any

from benchmarks.common import percentile
from benchmarks.pages_kit import BASELINE, Page, Plot, div, num, pct, ratio, table

#: figures of one affinity mode: (label, key, digits)
AFFINITY_COLUMNS = (("jobs", "jobs", 0), ("cold loads / 1000", "cold_per_1000", 1),
                    ("after first loads / 1000", "repeat_cold_per_1000", 1),
                    ("mean load ms", "load_ms", 0), ("mean run ms", "run_ms", 0),
                    ("p50 ms", "p50_ms", 0), ("p95 ms", "p95_ms", 0),
                    ("jobs/s", "jobs_per_s", 1))


def affinity(data: dict[str, Any]) -> Page:
    """``benchmarks/affinity.py``: cold model loads with route hashing vs shared queues."""
    modes = {mode: f for mode, f in data.items() if isinstance(f, dict) and mode != "meta"}
    ours, plain = modes["route hashing"], modes["plain Celery"]
    page = Page(
        "affinity", "Route hashing and cold loads",
        "Fresh CPU workers, each keeping a few models loaded, serve a skewed stream of jobs "
        "over 8 models (Zipf, s = 1.1) with a fixed number of jobs in flight. gpulanes "
        "sends each job to its model's worker on a consistent-hash ring with bounded "
        "loads; on plain Celery any free worker takes any job from a shared queue, "
        "each worker keeping its models least recently used. " + BASELINE,
        f"{pct(div(ours['cold'], ours['jobs']))} of jobs cold with route hashing "
        f"(plain Celery {pct(div(plain['cold'], plain['jobs']))})",
        f"cold loads {ratio(div(ours['cold'], plain['cold']))} of plain's; jobs/s "
        f"{ratio(div(ours['jobs_per_s'], plain['jobs_per_s']))}")
    rows = [[mode, *(num(f[key], digits) for _, key, digits in AFFINITY_COLUMNS)]
            for mode, f in modes.items()]
    return page.add("## Cold loads and latency", table(
        ["mode", *(label for label, _, _ in AFFINITY_COLUMNS)], rows),
        "Latency is queue wait plus run, of every job; *after first loads* leaves out "
        "each model's first load, which nothing could avoid.")


def fairness(data: dict[str, Any]) -> Page:
    """``benchmarks/fairness.py``: light and heavy accounts' waits in the relaxed lane."""
    waits, starved = data["waits_ms"], data["starvation"]
    light = {mode: statistics.median(w["light"]) for mode, w in waits.items()}
    page = Page(
        "fairness", "Fair relax",
        f"One gpulanes worker and one plain Celery worker; an account that has already "
        f"used the cluster queues {data['heavy']} relaxed jobs, and {data['light']} jobs "
        f"of light accounts arrive right behind them ({data['repeats']} interleaved "
        "repeats). gpulanes puts the heavy account's jobs in a later priority level of "
        "the relaxed lane; plain Celery runs one FIFO list in arrival order. " + BASELINE +
        " Waits are submit to start, stamped by the worker.",
        f"light accounts wait {num(light['gpulanes'], 0)} ms (p50; plain FIFO "
        f"{num(light['plain'], 0)} ms)",
        f"light users wait {ratio(div(light['plain'], max(light['gpulanes'], 1e-3)), 1)} "
        "less")
    rows = [["plain Celery FIFO" if mode == "plain" else mode,
             *(num(fn(w[group]), 0) for group in ("light", "heavy")
               for fn in (statistics.median, max))] for mode, w in waits.items()]
    page.add("## Waits (ms)", table(["mode", "light p50", "light max", "heavy p50",
                                     "heavy max"], rows))
    page.plot(Plot("fairness-waits.png", "waits of light and heavy accounts, per mode",
                   lambda fig: _fairness_plot(fig, waits)))
    return page.add(
        "## Starvation check",
        f"The heavy account queues one job right after a stream of newcomers' jobs that "
        f"takes {starved['stream_s']:.1f} s to drain: it waited {starved['waited_s']:.1f} s "
        f"(aging bound {data['aging_s']:g} s plus beat rounds), "
        f"{'bounded' if starved['waited_s'] < starved['stream_s'] else 'NOT bounded'}.")


def _fairness_plot(fig: Any, waits: dict[str, dict[str, list[float]]]) -> None:
    ax = fig.add_subplot()
    groups = [(mode, group) for mode in waits for group in ("light", "heavy")]
    ax.boxplot([[w / 1000 for w in waits[mode][group]] for mode, group in groups])
    ax.set_xticks(range(1, len(groups) + 1),
                  [f"{group}\n({'plain FIFO' if mode == 'plain' else mode})"
                   for mode, group in groups])
    ax.set_ylabel("wait (s), submit to start")
    ax.grid(alpha=0.3, axis="y")


def preempt(data: dict[str, Any]) -> Page:
    """``benchmarks/preempt.py``: fast jobs behind long relaxed jobs, with and without
    preemption."""
    rounds = data["rounds"]
    step_ms = statistics.median(r["step_ms"] for mode in rounds.values() for r in mode
                                if r["step_ms"])
    summary = {mode: _preempt_summary(found) for mode, found in rounds.items()}
    page = _preempt_page(rounds, summary, step_ms)
    rows = [[mode, s["jobs"], num(s["p50"], 0), num(s["p95"], 0), num(s["max"], 0),
             num(s["p50"] / step_ms), num(s["p95"] / step_ms), num(s["rate"], 3),
             pct(s["busy"]), s["preempted"]] for mode, s in summary.items()]
    page.add("## Fast waits and relaxed throughput", table(
        ["mode", "fast jobs", "wait p50 ms", "wait p95 ms", "wait max ms", "p50 in steps",
         "p95 in steps", "relaxed jobs/s", "workers' time in relaxed runs", "preemptions"],
        rows),
        f"Relaxed throughput lost to preemption: {pct(_loss(rounds))} (the share of the "
        "workers' time in relaxed runs, median of paired rounds).")
    cancels = [r["cancel_ms"] for r in rounds["preempt"] if "cancel_ms" in r]
    if cancels:
        page.add(f"A running relaxed job's `revoke()` took {statistics.median(cancels):.0f} ms "
                 f"to REVOKED (median of {len(cancels)}), "
                 f"{statistics.median(cancels) / step_ms:.1f} step times.")
    waits = {mode: [w for r in found for w in r["fast_wait_ms"]] for mode, found in rounds.items()}
    return page.plot(Plot("preempt-waits.png", "fast job waits with and without preemption",
                          lambda fig: _cdf_plot(fig, waits)))


def _preempt_page(rounds: dict[str, list[dict[str, Any]]], summary: dict[str, Any],
                  step_ms: float) -> Page:
    """The page's intro, headline and ratio: relaxed throughput lost, paired by round."""
    on, off = summary["preempt"], summary["no preempt"]
    return Page(
        "preempt", "Fast jobs behind long relaxed jobs",
        f"Two CPU workers and beat, for each mode in turn ({len(rounds['preempt'])} "
        "rounds, the order alternating): a backlog of long relaxed jobs keeps both workers "
        "busy while small fast jobs arrive at seeded random moments. With preemption a "
        "running relaxed job yields at its next step; without it "
        "(`GPULANES_PREEMPT=false`) the fast job waits for a worker to finish. A step "
        f"time is a relaxed job's run over its steps ({step_ms:.0f} ms here).",
        f"fast wait p50 {off['p50'] / step_ms:.1f} → {on['p50'] / step_ms:.1f} step times "
        "with preemption",
        f"relaxed throughput lost {pct(_loss(rounds))} (against no preemption)")


def _loss(rounds: dict[str, list[dict[str, Any]]]) -> float:
    """Relaxed throughput preemption cost: 1 - the median over paired rounds of the share
    of the workers' time in relaxed runs with preemption over the share without."""
    return 1 - statistics.median(a["relaxed_busy"] / b["relaxed_busy"]
                                 for a, b in zip(rounds["preempt"], rounds["no preempt"]))


def _preempt_summary(rounds: list[dict[str, Any]]) -> dict[str, Any]:
    waits = [w for r in rounds for w in r["fast_wait_ms"]]
    return {"jobs": len(waits), "p50": percentile(waits, 0.5), "p95": percentile(waits, 0.95),
            "max": max(waits), "rate": statistics.mean(r["relaxed_per_s"] for r in rounds),
            "busy": statistics.mean(r["relaxed_busy"] for r in rounds),
            "preempted": sum(r["preempted"] for r in rounds)}


def _cdf_plot(fig: Any, waits_ms: dict[str, list[float]]) -> None:
    ax = fig.add_subplot()
    for mode, waits in waits_ms.items():
        ordered = sorted(waits)
        ax.step(ordered, [(i + 1) / len(ordered) for i in range(len(ordered))], where="post",
                label=mode)
    ax.set_xlabel("fast job wait (ms), submit to start")
    ax.set_ylabel("share of fast jobs")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)


def overload(data: dict[str, Any]) -> Page:
    """``benchmarks/overload.py``: one pool driven at 2x its capacity, both modes."""
    tiers, modes = data["summary"]["tiers"], data["summary"]["modes"]
    page = _overload_page(data, tiers, modes)
    page.add("## Per requested tier", table(
        ["tier", "mode", "accepted", "refused (lane full)", "p50 s", "p95 s",
         "within budget", "moved down", "failed", "no result"],
        [[tier, mode, r["accepted"], r["refused"], num(r["p50_s"], 2), num(r["p95_s"], 2),
          pct(r["within_budget"], 0), _moved(r["moved"]), r["failed"], r["no_result"]]
         for tier in ("fast", "standard", "relaxed") for mode in tiers
         for r in [tiers[mode][tier]]], "llrrrrrlrr"))
    return page.add("## Per mode", table(
        ["mode", "offered jobs/s", "served jobs/s", "mean latency s", "drain s",
         "client CPU ms/job", "workers CPU ms/job", "Redis CPU ms/job"],
        [[mode, num(m["offered_jobs_s"]), num(m["served_jobs_s"]), num(m["mean_latency_s"], 2),
          num(m["drain_s"]), num(m["client_cpu_ms_per_job"], 2),
          num(m.get("workers_cpu_ms_per_job")), num(m.get("redis_cpu_ms_per_job"), 2)]
         for mode, m in modes.items()]),
        "## Trials", "In the order they ran; *slow s*: the seconds of the trial in which "
        "jobs ran more than 1.4 times the trial's median run, where the shared machine "
        "slowed down (no scheduling does that), which lowers what that trial's pool serves.",
        table(["trial", "mode", "served jobs/s", "load met", "fast within budget",
               "standard within budget", "slow s"],
              [[i + 1, t["mode"], num(t["served_jobs_s"]), ratio(t["load"]),
                pct(t["fast_within"]), pct(t["standard_within"], 0), num(t["slow_s"])]
               for i, t in enumerate(data["summary"]["trials"])], "llrrrrr"))


def _overload_page(data: dict[str, Any], tiers: dict[str, Any], modes: dict[str, Any]) -> Page:
    """The page's intro, headline (standard within budget) and ratio (served jobs/s)."""
    budgets = data["budgets"]
    served = {mode: m["served_jobs_s"] for mode, m in modes.items()}
    within = {mode: tiers[mode]["standard"]["within_budget"] for mode in tiers}
    return Page(
        "overload", "Two times the pool's capacity",
        "Two pools of CPU workers on one embedded Redis, gpulanes' (policy, beat, movers) "
        "and plain Celery's, each idle while the other serves, both reading "
        "`fast,standard,relaxed` in that order. Capacity is measured first, the pools' "
        f"bursts taking turns ({num(data['capacity_jobs_s'])} jobs/s); then an open-loop "
        f"stream at 2x that, {_mix(data['mix'])}, the same seeded jobs in both modes, and "
        "a full drain. " + BASELINE + " Budgets scale with the job size: fast "
        f"{budgets['fast_s']:.2f} s, standard {budgets['standard_s']:.2f} s.",
        f"standard within budget {pct(within['gpulanes'], 0)} (plain Celery "
        f"{pct(within['plain'], 0)})",
        f"served jobs/s {ratio(div(served['gpulanes'], served['plain']))}")


def _mix(mix: dict[str, float]) -> str:
    return ", ".join(f"{pct(share, 0)} {tier}" for tier, share in mix.items())


def _moved(moved: dict[str, Any]) -> str:
    """``{"past budget": [257, 22.1]}`` -> ``"past budget 257 (p50 22.1 s)"``."""
    return ", ".join(f"{why} {n[0]} (p50 {n[1]:.1f} s)" if isinstance(n, list) else
                     f"{why} {n}" for why, n in sorted(moved.items())) or "–"


RENDERERS = {"overload": overload, "fairness": fairness, "preempt": preempt,
             "affinity": affinity}
