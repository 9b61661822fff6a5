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
#: The first seconds of a paced trial run at the plan's own rate; from then on it runs
#: at the rate its pool has served since the trial began.
PACE_AFTER_S = 3.0
#: How often a paced trial reads the backlog and sets its rate again.
PACE_EVERY_S = 0.5
#: The slowest a paced plan's clock runs: a pool that stalls still gets every job of
#: the plan within four times its length, and the drain's limit reports what was lost.
PACE_MIN_SPEED = 0.25


@dataclass(frozen=True)
class Pace:
    """Hold an open loop at ``load`` times what its pool really serves: the machine's
    speed drifts by a quarter between minutes, and a rate fixed from the capacity bursts
    would meet anything from 1.9x to 2.7x. ``depth()`` reads the jobs still queued."""

    load: float
    depth: Callable[[], int]
    after_s: float = PACE_AFTER_S
    every_s: float = PACE_EVERY_S

    def __post_init__(self) -> None:
        if self.load <= 0 or self.every_s <= 0:
            raise ValueError("a pace needs load > 0 and every_s > 0")

    def speed(self, accepted: int, elapsed_s: float, plan_rate: float,
              queued_before: int = 0) -> float | None:
        """How fast the plan's clock should run: ``load`` x the jobs/s served so far
        (the ``accepted`` and the ``queued_before`` the trial, less those still queued:
        jobs taken off the lists) over the plan's own rate, at least ``PACE_MIN_SPEED``;
        None before ``after_s`` or before a job was taken."""
        if elapsed_s < self.after_s:
            return None
        served = accepted + queued_before - self.depth()
        if served <= 0:
            return None
        return max(PACE_MIN_SPEED, self.load * served / elapsed_s / plan_rate)


def offer(trial: Trial, plan: list[tuple[float, str, str]], send: Send,
          refusals: tuple[type[BaseException], ...] = (), pace: Pace | None = None) -> None:
    """Open loop: each job at its time (at once when late), whatever the backlog; a
    publish raising one of ``refusals`` counts as refused. With ``pace`` the plan's
    clock runs at ``pace.speed()``: the same jobs in the same order, at ``pace.load``
    times the rate the pool serves in this trial."""
    began, cpu = time.monotonic(), time.process_time()
    plan_rate = (len(plan) - 1) / plan[-1][0] if len(plan) > 1 and plan[-1][0] > 0 else 1.0
    clock, speed, last, paced_at = 0.0, 1.0, began, began
    before = pace.depth() if pace is not None else 0  # left from an earlier trial
    for seed, (offset, tier, account) in enumerate(plan):
        while True:
            now = time.monotonic()
            clock, last = clock + speed * (now - last), now
            if pace is not None and now - paced_at >= pace.every_s:
                paced_at = now
                speed = pace.speed(len(trial.accepted), now - began, plan_rate,
                                   before) or speed
            if clock >= offset:
                break
            wait = (offset - clock) / speed
            time.sleep(wait if pace is None else min(wait, pace.every_s))
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


def plain_trial(plan: list[tuple[float, str, str]], size: JobSize, drain_s: float,
                load: float | None = None) -> Trial:
    """One plain trial: the open loop (paced at ``load`` when given) and the drain,
    through the plain app only."""
    from benchmarks import plain_app

    trial = Trial("plain")
    offer(trial, plan, plain_send(size), pace=Pace(load, plain_app.depth) if load else None)
    drain(trial, drain_s, plain_app.depth)
    return trial
