"""What a run is judged by, from every finished job and every beat round.

Waits are ``queued_ms`` as a result reports it: from submission to the start of the
run that finished (a job put back after its worker died waits on from its first
submission). "Per lane" is the lane a job ran in; "within budget" is per requested
tier, against the tier's lane budget (relaxed: ``SimConfig.relaxed_budget_s``); fast
jobs are also counted apart from those their account's own limits moved (out of fast
seconds, over its fast places): what the cluster promises a paying caller.
"""
from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Sequence

from routing.names import FAST, LANES, RELAXED
from routing.policy import FAST_ACCOUNT_LIMIT, FAST_TIME_EXHAUSTED

from benchmarks.common import percentile
from benchmarks.simulate.config import SimConfig
from benchmarks.simulate.queues import SimJob

#: Moves down made by an account's own limits, not by the cluster's load.
OWN_LIMITS = frozenset({FAST_TIME_EXHAUSTED, FAST_ACCOUNT_LIMIT})
#: Width of the time bins of the waits-over-time series.
BIN_S = 10.0


@dataclass
class Recorder:
    """Collects finished jobs and beat rounds as the run goes."""

    start: float
    done: list[SimJob] = field(default_factory=list)
    rounds: list[dict] = field(default_factory=list)

    def job_done(self, job: SimJob) -> None:
        self.done.append(job)

    def round_done(self, summary: dict) -> None:
        self.rounds.append({"t": summary["at"] - self.start,
                            "overloaded": [lane for lane, state in summary["policy"].items()
                                           if state["overloaded"]],
                            "expected_wait_s": {lane: load["expected_wait_s"]
                                                for lane, load in summary["lanes"].items()},
                            "depth": {lane: load["depth"] for lane, load in
                                      summary["lanes"].items()}})


def quantiles(values: Sequence[float]) -> dict[str, float | None]:
    """p50/p95/p99 (nearest rank, as every benchmark here), seconds to 3 decimals."""
    return {name: None if (v := percentile(values, q)) is None else round(v, 3)
            for name, q in (("p50", 0.5), ("p95", 0.95), ("p99", 0.99))}


def mode_changes(rounds: Iterable[dict]) -> dict[str, int]:
    """Per lane, how many times the policy switched it between normal and overloaded."""
    changes, before = Counter(), set()
    for entry in rounds:
        now = set(entry["overloaded"])
        changes.update(now ^ before)
        before = now
    return {lane: changes.get(lane, 0) for lane in ("fast", "standard")}


def _within(jobs: list[SimJob], config: SimConfig) -> dict[str, float | None]:
    share = {}
    for tier in LANES:
        mine = [job for job in jobs if job.arrival.tier == tier]
        share[tier] = round(sum(job.wait_s <= config.budget_of(tier) for job in mine)
                            / len(mine), 4) if mine else None
    return share


def _fast_allowed(jobs: list[SimJob], config: SimConfig) -> float | None:
    """Within budget, of the fast jobs their accounts' own limits left in fast: not out
    of fast seconds (``fast_time_exhausted``: relaxed, as a paid plan's fast hours run
    out) nor over the account's fast places (``fast_account_limit``)."""
    mine = [job for job in jobs if job.arrival.tier == FAST and job.reason not in OWN_LIMITS]
    budget = config.budget_of(FAST)
    return round(sum(job.wait_s <= budget for job in mine) / len(mine), 4) if mine else None


def _relaxed_accounts(jobs: list[SimJob]) -> dict[str, dict]:
    """Waits of the jobs that ran in relaxed, heavy accounts apart from light ones."""
    out = {}
    for name, heavy in (("heavy", True), ("light", False)):
        waits = [job.wait_s for job in jobs if job.lane == RELAXED and job.arrival.heavy == heavy]
        out[name] = {"jobs": len(waits), **quantiles(waits)}
    return out


def _waits_by(jobs: list[SimJob], lane_of: Callable[[SimJob], str]) -> dict[str, dict]:
    """Per lane (the one it ran in, or its tier): jobs and wait quantiles."""
    waits: dict[str, list[float]] = {lane: [] for lane in LANES}
    for job in jobs:
        waits[lane_of(job)].append(job.wait_s)
    return {lane: {"jobs": len(found), **quantiles(found)} for lane, found in waits.items()}


def figures(recorder: Recorder, config: SimConfig, window_s: float, offered: int,
            refused: int, cold_loads: int) -> dict[str, Any]:
    """Every figure of one run (see the module's docstring)."""
    jobs, start = recorder.done, recorder.start
    waits = [job.wait_s for job in jobs]
    minutes = window_s / 60
    changes = mode_changes(r for r in recorder.rounds if r["t"] <= window_s)
    last = max((job.finished_at for job in jobs), default=start)
    return {
        "offered": offered, "served": len(jobs), "refused": refused,
        "served_jobs_s": round(sum(job.finished_at - start <= window_s for job in jobs)
                               / window_s, 2),
        "drain_s": round(max(0.0, last - start - window_s), 1),
        "lanes": _waits_by(jobs, lambda job: job.lane),
        "tiers": _waits_by(jobs, lambda job: job.arrival.tier),
        "within_budget": _within(jobs, config),
        "fast_allowed_within_budget": _fast_allowed(jobs, config),
        "all": quantiles(waits), "worst_wait_s": round(max(waits, default=0.0), 3),
        "mode_changes": changes,
        "mode_changes_per_min": round(sum(changes.values()) / minutes, 3),
        "cold_loads": cold_loads,
        "downgrades": dict(Counter(job.reason for job in jobs if job.reason)),
        "relaxed_accounts": _relaxed_accounts(jobs),
    }


def waits_over_time(jobs: Iterable[SimJob]) -> dict[str, list[list[float]]]:
    """Per lane, [bin start s, p50, p95] of the waits of jobs submitted in each bin."""
    bins: dict[str, dict[int, list[float]]] = {lane: {} for lane in LANES}
    for job in jobs:
        bins[job.lane].setdefault(int(job.arrival.at // BIN_S), []).append(job.wait_s)
    return {lane: [[k * BIN_S, round(percentile(v, 0.5), 3), round(percentile(v, 0.95), 3)]
                   for k, v in sorted(per.items())] for lane, per in bins.items()}
