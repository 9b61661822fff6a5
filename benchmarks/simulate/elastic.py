"""One pool of GPUs whose size a scaler sets while a trace of jobs runs on it.

The pool's workers hold its models warm and take jobs by lane priority (fast, then
standard, then relaxed), each lane first in, first out, one job per worker. A scaler is
asked every ``period_s`` how many workers the pool wants; the pool then:

- starts new workers, each serving after ``warm_s`` (its boot and its models' load);
- or stops workers: those still starting first (the newest), then idle ones, then busy
  ones, whose job steps aside at its next step (one step time, a thirtieth of its run)
  and goes to the front of its lane with the work it has left (the hand-over).

A worker is paid from its start to its stop: the GPU-hours. A job's wait is from its
arrival to its first start. Workers are counted, not named: the pool's size is the only
thing a scaler changes.
"""
from __future__ import annotations

import heapq
import math
from array import array
from collections import deque
from dataclasses import dataclass, field
from typing import Protocol

from gpu_worker.runtime import EWMA_ALPHA
from routing.names import LANES

from benchmarks.simulate.day import Trace

#: Steps of a job: a run steps aside at the next of them.
STEPS = 30
#: Seconds of each point of the series (fleet sizes, waits) the plots are drawn from.
SERIES_S = 60.0
_FINISH, _READY, _HANDED = 0, 1, 2


@dataclass
class View:
    """What a scaler sees of the pool in a round: its lanes and its workers."""

    now: float
    queued: list[int]  # jobs waiting, per lane
    running: list[int]  # jobs running, per lane
    busy_s: list[float]  # workers' busy seconds per lane since the start (a counter)
    service_s: list[float]  # measured mean seconds of a job, per lane
    serving: int  # workers that take jobs
    starting: int  # workers that will take jobs once warm


class Scaler(Protocol):
    """A policy: the workers the pool wants, asked every ``period_s``."""

    name: str
    period_s: float

    def wanted(self, view: View) -> int: ...


@dataclass
class Outcome:
    """What a run of a scaler on a trace gave."""

    waits: array  # per job, seconds from its arrival to its first start
    gpu_s: float  # paid worker-seconds
    handed_over: int  # runs that stepped aside for a scale-down
    starts: int  # workers started
    most: int  # the most workers paid at once
    #: Every SERIES_S: (time, wanted, serving, starting)
    series: list[tuple[float, int, int, int]] = field(default_factory=list)


class Pool:
    """The event loop of one run: arrivals from the trace, job ends, workers' warm-ups
    and hand-overs on one heap, the scaler's rounds between."""

    def __init__(self, trace: Trace, scaler: Scaler, warm_s: float, least: int, most: int,
                 start: int) -> None:
        self.trace, self.scaler, self.warm_s = trace, scaler, warm_s
        self.least, self.most = least, most
        self.queues: list[deque] = [deque() for _ in LANES]
        self.left_s: dict[int, float] = {}  # handed-over jobs: the run they have left
        self.running: dict[int, float] = {}  # job -> its run's end (insertion: start order)
        self.running_n = [0] * len(LANES)
        self.busy_s, self.busy_at = [0.0] * len(LANES), [0.0] * len(LANES)
        self.service_s = [trace.mean_run_s] * len(LANES)
        self.events: list[tuple[float, int, int]] = []
        self.starting: list[float] = []  # when each starting worker is warm (a heap)
        self.idle, self.stepping, self.wanted_n = start, 0, start
        self.paid_s, self.paid_at, self.most_paid = 0.0, 0.0, start
        self.waits = array("d", [math.nan]) * len(trace)
        self.handed_over, self.starts, self.now = 0, 0, 0.0
        self.series: list[tuple[float, int, int, int]] = []

    # --- the fleet ----------------------------------------------------------------------
    def paid(self) -> int:
        return self.idle + len(self.running) + self.stepping + len(self.starting)

    def _pay(self) -> None:
        self.paid_s += self.paid() * (self.now - self.paid_at)
        self.paid_at = self.now

    def resize(self, wanted: int) -> None:
        """Start or stop workers so that ``wanted`` serve or start (within the limits)."""
        wanted = self.wanted_n = max(self.least, min(self.most, wanted))
        have = self.idle + len(self.running) + len(self.starting)
        if wanted == have:
            return
        self._pay()
        for _ in range(wanted - have):  # more
            heapq.heappush(self.starting, self.now + self.warm_s)
            heapq.heappush(self.events, (self.now + self.warm_s, _READY, 0))
            self.starts += 1
        fewer = have - wanted
        while fewer > 0 and self.starting:  # the newest starting ones
            self.starting.remove(max(self.starting))
            heapq.heapify(self.starting)
            fewer -= 1
        gone = min(fewer, self.idle)
        self.idle -= gone
        for _ in range(fewer - gone):  # busy ones hand their job on at their next step
            job, ends = self.running.popitem()  # it runs on to its step: still busy
            step_s = self.trace.run_s[job] / STEPS
            self.left_s[job] = max(0.0, ends - self.now - step_s)
            self.stepping += 1
            self.handed_over += 1
            heapq.heappush(self.events, (self.now + step_s, _HANDED, job))
        self.most_paid = max(self.most_paid, self.paid())

    def _ready(self) -> None:
        """A worker is warm (unless it was stopped while it started)."""
        if self.starting and self.starting[0] <= self.now:
            heapq.heappop(self.starting)
            self.idle += 1
            self._dispatch()

    # --- the jobs -----------------------------------------------------------------------
    def _count_busy(self, lane: int) -> None:
        self.busy_s[lane] += self.running_n[lane] * (self.now - self.busy_at[lane])
        self.busy_at[lane] = self.now

    def _dispatch(self) -> None:
        queues, now = self.queues, self.now
        while self.idle:
            for queue in queues:
                if queue:
                    break
            else:
                return
            job = queue.popleft()
            lane = self.trace.lane[job]
            run_s = self.left_s.pop(job, None)
            if run_s is None:
                run_s = self.trace.run_s[job]
                self.waits[job] = now - self.trace.at[job]
            self.idle -= 1
            self._count_busy(lane)
            self.running_n[lane] += 1
            ends = self.running[job] = now + run_s
            heapq.heappush(self.events, (ends, _FINISH, job))

    def _stop_run(self, job: int) -> None:
        lane = self.trace.lane[job]
        self._count_busy(lane)
        self.running_n[lane] -= 1

    def _finish(self, job: int, when: float) -> None:
        if self.running.get(job) != when:
            return  # that run stepped aside
        del self.running[job]
        self._stop_run(job)
        lane = self.trace.lane[job]
        # each worker's moving average (EWMA_ALPHA), averaged over the pool's workers
        alpha = EWMA_ALPHA / (self.idle + len(self.running) + 1)
        self.service_s[lane] += alpha * (self.trace.run_s[job] - self.service_s[lane])
        self.idle += 1
        self._dispatch()

    def _handed(self, job: int) -> None:
        """The stopped worker's run reached its step: the job to its lane's front."""
        self._pay()
        self._stop_run(job)
        self.stepping -= 1
        self.queues[self.trace.lane[job]].appendleft(job)
        self._dispatch()

    # --- the run ------------------------------------------------------------------------
    def _round(self) -> None:
        for lane in range(len(LANES)):
            self._count_busy(lane)
        view = View(self.now, [len(q) for q in self.queues], list(self.running_n),
                    list(self.busy_s), list(self.service_s),
                    self.idle + len(self.running), len(self.starting))
        self.resize(self.scaler.wanted(view))

    def run(self) -> Outcome:
        trace, events = self.trace, self.events
        at, lanes, count = trace.at, trace.lane, len(trace)
        period, next_round, next_point, i = self.scaler.period_s, 0.0, 0.0, 0
        pop, queues = heapq.heappop, self.queues
        while i < count or events or any(queues):
            soonest = events[0][0] if events else math.inf
            arrival = at[i] if i < count else math.inf
            now = min(soonest, arrival, next_round)
            self.now = now
            if now == next_round:
                if now >= next_point:
                    self.series.append((now, self.wanted_n, self.idle + len(self.running),
                                        len(self.starting)))
                    next_point += SERIES_S
                self._round()
                next_round += period
            elif now == arrival:
                queues[lanes[i]].append(i)
                i += 1
                if self.idle:
                    self._dispatch()
            else:
                when, kind, job = pop(events)
                if kind == _FINISH:
                    self._finish(job, when)
                elif kind == _READY:
                    self._ready()
                else:
                    self._handed(job)
        self._pay()
        return Outcome(self.waits, self.paid_s, self.handed_over, self.starts,
                       self.most_paid, self.series)
