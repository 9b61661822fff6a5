"""One simulated run: a fleet, a workload and a mode (gpulanes or plain lanes)."""
from __future__ import annotations

import random
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

from routing.names import FAST, LANES

from benchmarks.simulate.cluster import Cluster, SimWorker
from benchmarks.simulate.config import EPOCH_S, SimConfig
from benchmarks.simulate.control import Accounts, Beat, Store
from benchmarks.simulate.engine import Clock
from benchmarks.simulate.metrics import Recorder, figures, waits_over_time
from benchmarks.simulate.preempt import Preemptor
from benchmarks.simulate.queues import Lists
from benchmarks.simulate.router import PlainRouter, Router, new_job
from benchmarks.simulate.workload import Arrival, ModelSpec
from tests.harness.fleet import hosts_of

MODES = ("gpulanes", "plain")
#: Heartbeats before the first job: a router starts from a snapshot (as overload.py
#: waits for a live view before it offers load).
LEAD_BEATS = 3


@dataclass(frozen=True)
class Fault:
    """At ``at_s``, ``hosts`` die; ``back_s`` later (None: never) they start again."""

    at_s: float
    hosts: tuple[str, ...]
    back_s: float | None = None


@dataclass(frozen=True)
class Fleet:
    """The workers: how many, their memory budgets (MB, one per worker in turn), what
    they hold warm at the start."""

    gpus: int
    memory_mb: Sequence[int] = (2, 3, 4)
    #: Models warm on each worker at the start, drawn by popularity (a fleet that has
    #: been serving a while), or none.
    prewarm: bool = True
    hosts: Sequence[str] = field(default=())

    #: The older name of ``memory_mb``, when given (models of 1 MB: a budget of N holds N).
    slots: Sequence[int] | None = None

    @property
    def budgets_mb(self) -> Sequence[int]:
        return self.memory_mb if self.slots is None else self.slots

    def host_names(self) -> list[str]:
        return list(self.hosts) or hosts_of(self.gpus)


@dataclass
class Outcome:
    """A run's figures, its series for plots, and its jobs and rounds (for tests)."""

    figures: dict[str, Any]
    series: dict[str, Any]
    recorder: Recorder
    accepted: int


def _workers(fleet: Fleet, specs: Sequence[ModelSpec], mode: str,
             seed: int) -> list[SimWorker]:
    rng = random.Random(f"fleet-{seed}")
    weights = [1 / (rank + 1) ** 1.1 for rank in range(len(specs))]
    workers = []
    for i, host in enumerate(fleet.host_names()):
        budgets = fleet.budgets_mb
        worker = SimWorker(host, i, budgets[i % len(budgets)],
                           None if mode == "gpulanes" else list(LANES))
        worker.start(EPOCH_S)
        if fleet.prewarm:  # as many draws as its budget holds models of the mean size
            mean_mb = sum(spec.memory_mb for spec in specs) / len(specs)
            for spec in rng.choices(specs, weights, k=max(1, round(worker.memory_mb / mean_mb))):
                worker.load(spec.name, 0.0, spec.memory_mb)
        workers.append(worker)
    return workers


class Run:
    """Wires the clock, lists, workers, beat and router of one run."""

    def __init__(self, arrivals: Sequence[Arrival], specs: Sequence[ModelSpec], fleet: Fleet,
                 mode: str, config: SimConfig, window_s: float, seed: int = 0,
                 faults: Sequence[Fault] = ()) -> None:
        self.arrivals, self.mode, self.config, self.window_s = arrivals, mode, config, window_s
        self.clock, self.lists = Clock(EPOCH_S), Lists()
        self.start = EPOCH_S + LEAD_BEATS * config.heartbeat_s
        self.recorder, self.accounts = Recorder(self.start), Accounts(config)
        self.cluster = Cluster(self.clock, self.lists, {s.name: s for s in specs},
                               _workers(fleet, specs, mode, seed), config.overhead_s,
                               self._done, config.pickup_s, config.pickups_s,
                               config.unmeasured_s)
        if mode == "gpulanes" and config.preempt:
            self.cluster.preemptor = Preemptor(self.cluster, config.max_preemptions,
                                               config.preempt_min_left_s,
                                               config.budget_of(FAST))
        self.store = Store()
        self.beat = Beat(self.clock, self.cluster, config, self.store, self.accounts,
                         self.recorder.round_done) if mode == "gpulanes" else None
        self.router = Router(self.clock, self.cluster, config, self.store, self.accounts) \
            if mode == "gpulanes" else PlainRouter(self.cluster)
        self.faults, self.next_arrival, self.accepted = faults, 0, 0

    def _done(self, job: Any) -> None:
        self.recorder.job_done(job)
        self.accounts.charge(job, self.clock.now)

    def finished(self) -> bool:
        """Every job offered, none queued or held: periodic events stop."""
        return (self.next_arrival >= len(self.arrivals) and not self.lists.queued()
                and not self.cluster.held)

    def _arrive(self) -> None:
        arrival = self.arrivals[self.next_arrival]
        self.accepted += self.router.submit(new_job(self.next_arrival, arrival, self.clock.now))
        self.next_arrival += 1
        if self.next_arrival < len(self.arrivals):
            self.clock.at(self.start + self.arrivals[self.next_arrival].at, self._arrive)

    def _schedule(self) -> None:
        clock, hb = self.clock, self.config.heartbeat_s
        self.cluster.start_all()
        if self.beat is not None:
            self.beat.schedule_pushes(self.finished)
            clock.every(hb, self.beat.round, clock.now + hb, self.finished)
        else:
            restore_s = max(1.0, min(10.0, self.config.visibility_s // 4))
            clock.every(restore_s, self._restore_unacked, clock.now + restore_s, self.finished)
        self.router.schedule(self.finished)
        for fault in self.faults:
            clock.at(self.start + fault.at_s, self._fault, fault.hosts, self.cluster.kill)
            if fault.back_s is not None:
                clock.at(self.start + fault.at_s + fault.back_s, self._fault, fault.hosts,
                         self.cluster.restart)
        if self.arrivals:
            clock.at(self.start + self.arrivals[0].at, self._arrive)

    def _fault(self, hosts: Sequence[str], act: Callable[[str], None]) -> None:
        for host in hosts:
            act(host)

    def _restore_unacked(self) -> None:
        """Plain lanes have no health check: kombu restores a job its dead worker
        held once it is older than the visibility timeout."""
        now, cluster = self.clock.now, self.cluster
        for job_id, (_, who, taken_at, _) in list(cluster.held.items()):
            if who in cluster.died and now - taken_at >= self.config.visibility_s:
                cluster.put_back(job_id)

    def go(self) -> Outcome:
        """Run to the end: every accepted job served."""
        began = time.process_time()
        self._schedule()
        self.clock.run()
        figs = figures(self.recorder, self.config, self.window_s, len(self.arrivals),
                       self.router.refused, self.cluster.cold_loads)
        preemptor = self.cluster.preemptor
        figs["preempted"] = preemptor.preempted if preemptor else 0
        figs["sim_cpu_s"] = round(time.process_time() - began, 2)
        series = {"waits": waits_over_time(self.recorder.done),
                  "rounds": self.recorder.rounds}
        return Outcome(figs, series, self.recorder, self.accepted)
