"""One trial of ``benchmarks/overload.py``, whichever side it drives, and the plain side's
own entry points.

The open loop, the drain, the warm-up and the capacity bursts take the side's publish as a function,
so both sides run the same code. The ``plain_*`` functions run in
the plain publisher's process (``benchmarks.plain_run.PlainClient``): this module
imports no gpulanes code, and they publish through ``benchmarks.plain_app`` only.
"""
from __future__ import annotations

import random
import statistics
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Callable

from benchmarks.common import TIERS, JobSize, PROMPT

ACCOUNTS = ("acme", "globex", "initech", "umbrella")
CAPACITY_JOBS = 60
WARMUP_JOBS = 12
#: (tier, account, seed) -> the job's AsyncResult.
Send = Callable[[str, str, int], Any]


@dataclass
class Trial:
    """What one trial offered, what was accepted or refused, and what each job became."""

    mode: str
    offered: int = 0
    accepted: list[tuple[str, Any]] = field(default_factory=list)
    refused: Counter = field(default_factory=Counter)
    submit_s: float = 0.0
    drain_s: float = 0.0
    outcomes: list[dict[str, Any]] = field(default_factory=list)
    queued_at_deadline: int = 0
    client_cpu_s: float = 0.0
    beat_cpu_s: float = 0.0
    workers_cpu_s: float = 0.0
    redis_cpu_s: float = 0.0


def workload(rate: float, duration_s: float, mix: dict[str, float],
             seed: int) -> list[tuple[float, str, str]]:
    """(offset s, tier, account) of every job: evenly spaced, tiers and accounts drawn."""
    rng = random.Random(seed)
    tiers, weights = list(mix), list(mix.values())
    return [(i / rate, rng.choices(tiers, weights)[0], rng.choice(ACCOUNTS))
            for i in range(int(rate * duration_s))]


# --- capacity ------------------------------------------------------------------------
def start_to_start_rate(done: list[dict]) -> float:
    """Jobs/s of the pool: per worker, one over its mean start-to-start time, summed."""
    starts: dict[str, list[float]] = {}
    for result in done:
        starts.setdefault(result["worker"], []).append(result["started_at"])
    rates = [(len(s) - 1) / (max(s) - min(s)) for s in starts.values() if len(s) > 1]
    return sum(rates)


def warm_up(send: Send) -> None:
    """A few jobs through all lanes, waited for: first connections, first model runs."""
    from celery.result import ResultSet

    ResultSet([send(TIERS[i % 3], ACCOUNTS[0], i) for i in range(WARMUP_JOBS)]).get(timeout=120)


def capacity_burst(send: Send) -> tuple[float, float]:
    """(jobs/s of the pool, mean run_ms) over one burst through all lanes."""
    from celery.result import ResultSet

    jobs = [send(TIERS[i % 3], ACCOUNTS[i % 4], i) for i in range(CAPACITY_JOBS)]
    done = ResultSet(jobs).get(timeout=300)
    return start_to_start_rate(done), statistics.fmean(r["run_ms"] for r in done)


# --- one trial ---------------------------------------------------------------------------
def offer(trial: Trial, plan: list[tuple[float, str, str]], send: Send,
          refusals: tuple[type[BaseException], ...] = ()) -> None:
    """Open loop: each job at its time (at once when late), whatever the backlog; a
    publish raising one of ``refusals`` counts as refused."""
    began, cpu = time.monotonic(), time.process_time()
    for seed, (offset, tier, account) in enumerate(plan):
        pause = began + offset - time.monotonic()
        if pause > 0:
            time.sleep(pause)
        try:
            trial.accepted.append((tier, send(tier, account, seed)))
        except refusals:
            trial.refused[tier] += 1
    trial.offered, trial.submit_s = len(plan), time.monotonic() - began
    trial.client_cpu_s = time.process_time() - cpu  # this process, its threads included


def drain(trial: Trial, limit_s: float, depth: Callable[[], int]) -> None:
    """Wait (at most ``limit_s``) for every accepted job; record what each became
    (``depth()``: the jobs still queued, read when the wait runs out)."""
    from celery.exceptions import TimeoutError as CeleryTimeout
    from celery.result import ResultSet

    began = time.monotonic()
    try:
        ResultSet([r for _, r in trial.accepted]).join_native(timeout=limit_s, propagate=False)
    except CeleryTimeout:
        trial.queued_at_deadline = depth()
    trial.drain_s = time.monotonic() - began
    for tier, result in trial.accepted:
        state = "done" if result.successful() else "failed" if result.failed() else "missing"
        trial.outcomes.append({"tier": tier, "state": state,
                               "result": result.result if state == "done" else None})
    trial.accepted = [(tier, result.id) for tier, result in trial.accepted]  # picklable


# --- the plain side, in its own process --------------------------------------------------
def plain_send(size: JobSize) -> Send:
    """A plain user's publish of one job: ``apply_async`` to the tier's queue."""
    from benchmarks import plain_app

    return lambda tier, account, seed: plain_app.send(tier, PROMPT, seed, size)


def plain_warm_up(size: JobSize) -> None:
    """:func:`warm_up` of the plain workers."""
    warm_up(plain_send(size))


def plain_burst(size: JobSize) -> tuple[float, float]:
    """:func:`capacity_burst` of the plain workers."""
    return capacity_burst(plain_send(size))


def plain_trial(plan: list[tuple[float, str, str]], size: JobSize, drain_s: float) -> Trial:
    """One plain trial: the open loop and the drain, through the plain app only."""
    from benchmarks import plain_app

    trial = Trial("plain")
    offer(trial, plan, plain_send(size))
    drain(trial, drain_s, plain_app.depth)
    return trial
