"""Figures and tables for ``benchmarks/overload.py``: from the trials to what it prints.

A trial leaves one outcome per accepted job (its requested tier, ``done``,
``failed`` or ``missing``, and the worker's result dict); :func:`summary`
reduces them to a row per (mode, requested tier) and one per mode, and
:func:`print_report` prints both tables and the verdict lines.
"""
from __future__ import annotations

import statistics
from collections import Counter
from typing import TYPE_CHECKING, Any

from benchmarks.common import TIERS, markdown_table, percentile

if TYPE_CHECKING:
    from benchmarks.overload_plan import Budgets, Settings
    from benchmarks.overload_trial import Trial

MODES = ("gpulanes", "plain")  # the two modes compared, in the order the tables list them


# --- figures ---------------------------------------------------------------------------
def latency_s(result: dict) -> float:
    """Submit to finish in seconds, as the worker measured it: queued plus run time."""
    return (result["queued_ms"] + result["run_ms"]) / 1000


def within(latencies: list[float], tier: str, budgets: Budgets) -> float | None:
    """Share of ``latencies`` within ``tier``'s budget; None for a tier without one, or
    no latencies."""
    budget = {"fast": budgets.fast_s, "standard": budgets.standard_s}.get(tier)
    return sum(x <= budget for x in latencies) / len(latencies) if budget and latencies \
        else None


def tier_row(trials: list[Trial], tier: str, budgets: Budgets) -> dict[str, Any]:
    """One (mode, tier) row over every repeat of that mode."""
    outs = [o for t in trials for o in t.outcomes if o["tier"] == tier]
    done = [o["result"] for o in outs if o["state"] == "done"]
    lat = [latency_s(r) for r in done]
    return {
        "accepted": len(outs), "refused": sum(t.refused[tier] for t in trials),
        "p50_s": percentile(lat, 0.50), "p95_s": percentile(lat, 0.95),
        "within_budget": within(lat, tier, budgets),
        "moved": moved_latency(done),
        "ran_in": dict(Counter(r["lane"] for r in done)),
        "failed": sum(o["state"] == "failed" for o in outs),
        "no_result": sum(o["state"] == "missing" for o in outs),
    }


def moved_latency(done: list[dict]) -> dict[str, tuple[int, float]]:
    """downgrade_reason -> (jobs, their median latency s)."""
    by_reason: dict[str, list[float]] = {}
    for r in done:
        if r.get("downgrade_reason"):
            by_reason.setdefault(r["downgrade_reason"], []).append(latency_s(r))
    return {k: (len(v), statistics.median(v)) for k, v in sorted(by_reason.items())}


def mode_row(trials: list[Trial]) -> dict[str, Any]:
    """Per mode: rates, served jobs/s, mean latency, drain time."""
    done = [o["result"] for t in trials for o in t.outcomes if o["state"] == "done"]
    busy_s = sum(t.submit_s + t.drain_s for t in trials)
    return {
        "offered_jobs_s": sum(t.offered for t in trials) / sum(t.submit_s for t in trials),
        "accepted": sum(len(t.accepted) for t in trials),
        "served_jobs_s": len(done) / busy_s,
        "mean_latency_s": statistics.fmean(latency_s(r) for r in done) if done else None,
        "p99_s": percentile([latency_s(r) for r in done], 0.99),
        "max_s": max((latency_s(r) for r in done), default=None),
        "drain_s": statistics.fmean(t.drain_s for t in trials),
        "queued_at_deadline": sum(t.queued_at_deadline for t in trials),
        "client_cpu_ms_per_job": 1000 * sum(t.client_cpu_s for t in trials)
        / max(1, sum(t.offered for t in trials)),
        "beat_cpu_share": sum(t.beat_cpu_s for t in trials) / busy_s,
        "between_jobs_ms": between_jobs_ms(done),
        "idle_tail_s": statistics.fmean(idle_tail_s(t) for t in trials),
        "workers_cpu_ms_per_job": 1000 * sum(t.workers_cpu_s for t in trials) / max(1, len(done)),
        "redis_cpu_ms_per_job": 1000 * sum(t.redis_cpu_s for t in trials) / max(1, len(done)),
    }


def between_jobs_ms(done: list[dict[str, Any]]) -> float | None:
    """A worker's mean time from one job's end to the next one's start, over the jobs
    it ran back to back (the next started within a second: the backlog of an overload
    trial); what a worker spends per job beyond running it."""
    by_worker: dict[str, list[dict]] = {}
    for result in done:
        by_worker.setdefault(result["worker"], []).append(result)
    gaps: list[float] = []
    for jobs in by_worker.values():
        ordered = sorted(jobs, key=lambda r: r["started_at"])
        gaps += [b["started_at"] - a["started_at"] - a["run_ms"] / 1000
                 for a, b in zip(ordered, ordered[1:])]
    gaps = [gap for gap in gaps if 0 <= gap < 1.0]
    return 1000 * statistics.fmean(gaps) if gaps else None


def idle_tail_s(trial: Trial) -> float:
    """How long the first worker to run out of jobs at the end of ``trial`` sat idle
    while another still ran its last ones: the last job's end less the earliest of the
    workers' last job ends."""
    ends: dict[str, float] = {}
    for outcome in trial.outcomes:
        if outcome["state"] == "done":
            result = outcome["result"]
            end = result["started_at"] + result["run_ms"] / 1000
            ends[result["worker"]] = max(end, ends.get(result["worker"], end))
    return max(ends.values()) - min(ends.values()) if ends else 0.0


#: A stretch of a trial where the pool's runs took this much longer than the trial's
#: median run was a slow stretch of the machine: every job in the pool ran slower
#: there, which no scheduling does. Counted in bins of SLOW_BIN_S of start times.
SLOW_FACTOR = 1.4
SLOW_BIN_S = 0.5


def slow_s(done: list[dict[str, Any]]) -> float:
    """Seconds of a trial in which the jobs that started ran, on average, more than
    ``SLOW_FACTOR`` times the trial's median run: where this shared machine slowed down
    (a fast job's budget is a few runs: such a stretch alone can make it miss)."""
    if not done:
        return 0.0
    median = statistics.median(r["run_ms"] for r in done)
    bins: dict[int, list[float]] = {}
    for result in done:
        bins.setdefault(int(result["started_at"] // SLOW_BIN_S), []).append(result["run_ms"])
    return SLOW_BIN_S * sum(statistics.fmean(runs) > SLOW_FACTOR * median
                            for runs in bins.values())


def standard_most(load: float, mix: dict[str, float]) -> float:
    """The largest share of standard jobs that can start within budget at ``load`` (jobs
    offered over jobs the pool serves), once fast jobs take their share of the pool:
    (1 - fast x load) / (standard x load), between 0 and 1."""
    if load <= 0 or not mix.get("standard"):
        return 1.0
    return max(0.0, min(1.0, (1 - mix["fast"] * load) / (mix["standard"] * load)))


def window_served(done: list[dict[str, Any]]) -> float:
    """Jobs/s the pool started while jobs were still being offered: from the first
    publish to the last (``started_at`` less ``queued_ms``), the jobs started in it."""
    published = [r["started_at"] - r["queued_ms"] / 1000 for r in done]
    if len(published) < 2 or max(published) <= min(published):
        return 0.0
    started = sum(1 for r in done if r["started_at"] <= max(published))
    return started / (max(published) - min(published))


def trial_row(trial: Trial, budgets: Budgets, mix: dict[str, float]) -> dict[str, Any]:
    """One trial on its own: the load it really met, the rate offered over the rate
    its pool served while jobs were offered (on this 2-core machine the drain, with no
    publisher beside the workers, runs faster), and over its window and drain; fast and
    standard jobs within budget, against the most the load allows. This machine's speed
    drifts between trials, and with it the pool's rate."""
    done = [o["result"] for o in trial.outcomes if o["state"] == "done"]
    offered = trial.offered / max(1e-9, trial.submit_s)
    served = len(done) / max(1e-9, trial.submit_s + trial.drain_s)
    in_window = window_served(done)
    load = offered / in_window if in_window else 0.0
    shares = {tier: within([latency_s(o["result"]) for o in trial.outcomes
                            if o["tier"] == tier and o["state"] == "done"], tier, budgets)
              for tier in ("fast", "standard")}
    most = standard_most(load, mix)
    share = shares["standard"] / most if shares["standard"] is not None and most else None
    return {"mode": trial.mode, "served_jobs_s": served, "load": load,
            "load_with_drain": offered / served if served else 0.0,
            "fast_within": shares["fast"], "standard_within": shares["standard"],
            "standard_most": most, "share_of_most": share, "slow_s": slow_s(done)}


def summary(trials: list[Trial], budgets: Budgets, mix: dict[str, float]) -> dict[str, Any]:
    """Per mode: a row per tier and one for the mode as a whole; per trial, in order, the
    load it met."""
    by_mode = {m: [t for t in trials if t.mode == m] for m in MODES}
    return {"tiers": {m: {tier: tier_row(ts, tier, budgets) for tier in TIERS}
                      for m, ts in by_mode.items()},
            "modes": {m: mode_row(ts) for m, ts in by_mode.items()},
            "trials": [trial_row(t, budgets, mix) for t in trials]}


# --- report ----------------------------------------------------------------------------
def fmt(value: float | None, pattern: str = "{:.2f}") -> str:
    """``value`` formatted with ``pattern``, or "-" when None."""
    return "-" if value is None else pattern.format(value)


def counts(mapping: dict[str, Any]) -> str:
    """{"a": 3} -> "a 3"; {"a": (3, 1.5)} -> "a 3 (p50 1.5s)"."""
    return ", ".join(f"{k} {v[0]} (p50 {v[1]:.1f}s)" if isinstance(v, (tuple, list))
                     else f"{k} {v}" for k, v in sorted(mapping.items())) or "-"


def tier_table(tiers: dict[str, dict[str, dict]]) -> str:
    """One row per (requested tier, mode): counts, latency, budget share, moves."""
    rows = [[tier, mode, r["accepted"], r["refused"], fmt(r["p50_s"]), fmt(r["p95_s"]),
             fmt(r["within_budget"], "{:.0%}"), counts(r["moved"]), counts(r["ran_in"]),
             r["failed"], r["no_result"]]
            for tier in TIERS for mode in MODES for r in [tiers[mode][tier]]]
    return markdown_table(["tier", "mode", "accepted", "LaneFull", "p50 s", "p95 s",
                           "within budget", "moved down (reason n)", "ran in", "failed",
                           "no result"], rows, align="llrrrrrllrr")


def mode_table(modes: dict[str, dict]) -> str:
    """One row per mode: rates, latency, drain time, CPU."""
    rows = [[mode, f"{m['offered_jobs_s']:.1f}", m["accepted"], f"{m['served_jobs_s']:.1f}",
             fmt(m["mean_latency_s"]), f"{m['drain_s']:.1f}", m["queued_at_deadline"],
             f"{m['client_cpu_ms_per_job']:.2f}", f"{m['beat_cpu_share']:.0%}",
             fmt(m.get("between_jobs_ms")), fmt(m.get("idle_tail_s"), "{:.1f}"),
             f"{m.get('workers_cpu_ms_per_job', 0):.1f}",
             f"{m.get('redis_cpu_ms_per_job', 0):.2f}"]
            for mode in MODES for m in [modes[mode]]]
    return markdown_table(["mode", "offered jobs/s", "accepted", "served jobs/s",
                           "mean latency s", "drain s", "still queued at deadline",
                           "client CPU ms/job", "beat CPU (of one core)",
                           "ms between a worker's jobs", "idle tail s", "workers CPU ms/job",
                           "Redis CPU ms/job"], rows)


def trial_table(trials: list[dict[str, Any]]) -> str:
    """One row per trial, in the order they ran: the load it met, fast's and standard's
    shares, and how long the machine ran slow in it."""
    rows = [[i + 1, t["mode"], f"{t['served_jobs_s']:.1f}", f"{t['load']:.2f}x",
             f"{t['load_with_drain']:.2f}x",
             fmt(t["fast_within"], "{:.1%}"), fmt(t["standard_within"], "{:.0%}"),
             f"{t['standard_most']:.0%}", fmt(t["share_of_most"], "{:.0%}"),
             fmt(t["slow_s"], "{:.1f}")]
            for i, t in enumerate(trials)]
    return markdown_table(["trial", "mode", "served jobs/s", "load met",
                           "over window + drain", "fast within budget",
                           "standard within budget", "the most at that load",
                           "share of the most", "slow s"], rows)


def compare(tiers: dict[str, dict[str, dict]], tier: str, key: str) -> str:
    """'<tier> gpulanes X vs plain Y (better|worse|same)' for a lower-is-better key."""
    g, p = tiers["gpulanes"][tier][key], tiers["plain"][tier][key]
    if g is None or p is None:
        return f"{tier} n/a"
    word = "within 5%" if abs(g - p) <= 0.05 * max(p, 1e-9) else "better" if g < p else "worse"
    return f"{tier} {g:.2f} vs {p:.2f} ({word})"


def load_line(report: dict[str, Any]) -> str:
    """How hard each pool was really driven: the trials' loads met, and what fast and
    standard alone asked for."""
    trials = report["summary"]["trials"]
    above = sum(report["mix"][t] for t in ("fast", "standard"))
    mean = {m: statistics.fmean([t["load"] for t in trials if t["mode"] == m] or [0.0])
            for m in MODES}
    loads = [t["load"] for t in trials]
    return ("load met (offered over served while offering), gpulanes / plain: "
            + " / ".join(f"{mean[m]:.2f}x" for m in MODES)
            + f" (trials {min(loads):.2f}x-{max(loads):.2f}x); fast+standard alone "
            f"{above * mean['plain']:.2f}x")


def policy_line(tiers: dict[str, dict[str, dict]]) -> str:
    """What the gpulanes policy moved down, by requested tier and reason."""
    moved = Counter({f"{tier} {reason}": n for tier, row in tiers["gpulanes"].items()
                     for reason, (n, _) in row["moved"].items()})
    if not moved:
        return ("the gpulanes policy never moved a job: both modes ran the same lanes in the "
                "same order, so any gap between them is beat/submit overhead or noise")
    return f"gpulanes moved jobs down (requested tier, reason): {counts(dict(moved))}"


def verdict(report: dict[str, Any]) -> list[str]:
    """The lines under the tables: load, policy, budgets, p95, mean latency, lost jobs."""
    tiers, modes = report["summary"]["tiers"], report["summary"]["modes"]
    lost = sum(r["no_result"] for m in MODES for r in tiers[m].values())
    within = {t: [fmt(tiers[m][t]["within_budget"], "{:.0%}") for m in MODES]
              for t in ("fast", "standard")}
    return [load_line(report), policy_line(tiers),
            "within budget (gpulanes / plain): " + ", ".join(
                f"{t} {g} / {p}" for t, (g, p) in within.items()),
            "p95 latency s, gpulanes vs plain: " + "; ".join(
                compare(tiers, t, "p95_s") for t in TIERS),
            f"mean latency over all jobs: gpulanes {fmt(modes['gpulanes']['mean_latency_s'])}s,"
            f" plain {fmt(modes['plain']['mean_latency_s'])}s (a policy moves waiting between "
            "tiers; it adds no capacity)",
            worst_line(modes),
            f"jobs without a result: {lost} (must be 0)"]


def worst_line(modes: dict[str, Any]) -> str:
    """gpulanes' worst latency against plain lanes' p99 over all jobs (the bound:
    no accepted job worse than 1.5x)."""
    worst, p99 = modes["gpulanes"]["max_s"], modes["plain"]["p99_s"]
    if worst is None or not p99:
        return "worst latency: no jobs"
    return (f"worst latency gpulanes {worst:.2f}s, plain p99 {p99:.2f}s (p99 gpulanes "
            f"{fmt(modes['gpulanes']['p99_s'])}s): {worst / p99:.2f}x (goal <= 1.5x)")


def capacity_words(report: dict[str, Any]) -> str:
    """``"gpulanes 41.0, plain 44.2"``: each pool's measured jobs/s."""
    return ", ".join(f"{side} {rate:.1f}" for side, (rate, _) in report["capacity_by_side"].items())


def print_report(report: dict[str, Any], settings: Settings) -> None:
    """Both tables, the verdict lines and one line on the run's settings."""
    print(tier_table(report["summary"]["tiers"]))
    print()
    print(mode_table(report["summary"]["modes"]))
    print()
    print(trial_table(report["summary"]["trials"]))
    print()
    for line in verdict(report):
        print(f"- {line}")
    b = report["budgets"]
    mix = "/".join(f"{settings.mix[t]:.0%}" for t in TIERS)
    print(f"mix fast/standard/relaxed {mix}; {settings.workers} CPU workers, "
          f"{settings.size.steps} steps at {settings.size.size}px: capacity "
          f"{report['capacity_jobs_s']:.1f} jobs/s ({capacity_words(report)}), planned "
          f"{report['offered_jobs_s']:.1f} jobs/s for {settings.duration_s:g}s per trial"
          f"{'' if settings.paced else ' (fixed)'}, {settings.repeats} repeat(s); "
          f"budgets fast {b['fast_s']:.2f}s, standard "
          f"{b['standard_s']:.2f}s; total wall time {report['wall_s']:.1f}s")
