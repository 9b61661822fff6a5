"""Simulated GPU workers: each reads its lists in kombu's order, one job at a time
(threads pool, concurrency 1, prefetch 1, late acks: it holds the job it runs and
nothing more), keeps its models within its memory budget (least recently used out,
as the real worker: ``routing.snapshot.touched``), pays a cold load
for a model it does not hold, and reports itself through the real worker runtime
(``gpu_worker.runtime.Runtime``: the service-time moving average, the cost lines).
"""
from __future__ import annotations

import itertools
import random
from collections import OrderedDict
from pathlib import Path
from typing import Callable, Mapping, Protocol, Sequence

from gpu_worker.runtime import Runtime
from routing.names import FAST, LANES, first_level
from routing.placement import touched
from tasks.broker.keys import PRIORITY_SEP

from benchmarks.simulate.engine import Clock
from benchmarks.simulate.queues import Lists, SimJob, list_key, node_of_key, read_order, step_of
from benchmarks.simulate.workload import ModelSpec


class RunWatcher(Protocol):
    """What the cluster tells of its runs (``benchmarks.simulate.preempt.Preemptor``)."""

    def offer(self, worker: "SimWorker", job: SimJob) -> None: ...

    def pushed(self, key: str) -> None: ...


class SimWorker:
    """One GPU's worker process; a restart is a new incarnation with no warm model."""

    def __init__(self, host: str, index: int, memory_mb: int,
                 queues: list[str] | None) -> None:
        self.host, self.index, self.memory_mb = host, index, memory_mb
        #: Each model's size in MB, as this worker learned it loading the model.
        self.sizes: dict[str, int] = {}
        self.queues = queues
        self.order = read_order(host, queues)
        self.alive = False
        self.running: SimJob | None = None
        self.died_at: float | None = None
        self.runtime = Runtime()
        self.warm: tuple[str, ...] = ()
        self.incarnation = ""
        #: Told of a fast job (own: in its own queue) for this run: (job id, its token).
        self.told_own, self.told_run = False, None
        # the last stats built, until a job or a load changes them (most pushes of a
        # worker running a job of several seconds repeat the last one)
        self._stats: dict | None = None
        #: What its last push stored (``push``), and the stats built it came from.
        self._pushed: dict | None = None
        self._pushed_from: dict | None = None
        #: The clock its runtime counts busy time by (the cluster's virtual one).
        self.clock: Callable[[], float] = lambda: 0.0

    def start(self, now: float) -> None:
        """A fresh process: new incarnation, models cold."""
        runtime = self.runtime = Runtime(clock=self.clock)
        runtime.configure(self.host, f"cuda:{self.index % 8}", {}, Path("."), self.memory_mb)
        runtime.sizes_mb = self.sizes
        runtime.started_at = now
        self.alive, self.running, self.warm, self.died_at = True, None, (), None
        self.told_own, self.told_run = False, None
        self.incarnation, self._stats = runtime.incarnation, None

    def changed(self) -> None:
        """A job started or finished here: the next push builds its stats afresh."""
        self._stats = None

    def load(self, model: str, load_s: float, memory_mb: int = 1) -> None:
        """``model`` (of ``memory_mb``) runs here now: warm (loaded if it was not), least
        recently used out until the rest fit the worker's budget."""
        self.sizes[model] = memory_mb
        before, self.warm = self.warm, touched(self.warm, model, self.memory_mb, self.sizes)
        runtime = self.runtime
        for gone in set(before) - set(self.warm):
            runtime.load_ms.pop(gone, None)
        if load_s:
            runtime.load_ms[model] = load_s * 1000
        runtime.models = OrderedDict((name, None) for name in self.warm)
        self._stats = None

    def stats(self, now: float) -> dict:
        """What it pushes each heartbeat (``gpu_worker.control.stats_of``)."""
        reply = self._stats
        if reply is None:
            reply = self._stats = self.runtime.stats()
            queues = self.queues or [q for q in self.order if PRIORITY_SEP not in q]
            reply.update(queues=queues, lanes=list(LANES), concurrency=1, batching={},
                         sick=None)
        reply["at"], reply["busy_s"] = now, self.runtime.busy_until(now)
        return reply

    def push(self, now: float) -> tuple[dict | None, bool]:
        """What its push stores now (``tasks.broker.stats.push_stats``: its stats, less
        its own clock ``at``), None when they are the ones it pushed last (the push only
        stamps them: nothing started, ended or loaded since, the same stats built, and
        no job in flight adding busy time); and whether only its busy time moved (then
        only that: ``{"busy_s": ...}``)."""
        same = self._stats is not None and self._stats is self._pushed_from
        if same and not any(self.runtime.in_flight.values()):
            return None, False
        reply = self.stats(now)
        if same and self._pushed is not None:
            if reply["busy_s"] == self._pushed["busy_s"]:
                return None, False
            self._pushed["busy_s"] = reply["busy_s"]
            return {"busy_s": reply["busy_s"]}, True
        stats = {key: value for key, value in reply.items() if key != "at"}
        self._pushed_from = reply
        if stats == self._pushed:
            return None, False
        self._pushed = stats
        return stats, False


class Cluster:
    """The workers, the lists they read, and the jobs they hold (unacked)."""

    def __init__(self, clock: Clock, lists: Lists, specs: Mapping[str, ModelSpec],
                 workers: list[SimWorker], overhead_s: float,
                 on_done: Callable[[SimJob], None], pickup_s: float = 0.0,
                 pickups_s: Sequence[float] = (), unmeasured_s: float = 0.0) -> None:
        self.clock, self.lists, self.specs = clock, lists, specs
        self.unmeasured_s = unmeasured_s  # of each job's busy time, not in its service
        self.workers = {w.host: w for w in workers}
        for worker in workers:  # started before: their runtimes count on this clock too
            worker.clock = worker.runtime.clock = clock.time
        self.overhead_s, self.pickup_s, self.on_done = overhead_s, pickup_s, on_done
        drawn = list(pickups_s)
        random.Random(0).shuffle(drawn)
        #: The next pickup of a woken worker: the measured ones in turn, else pickup_s.
        self._pickups = itertools.cycle(drawn) if drawn else itertools.repeat(pickup_s)
        self.idle: OrderedDict[str, None] = OrderedDict()  # BRPOP-blocked, longest first
        #: job id -> (job, incarnation holding it, when taken, the list it came from)
        self.held: dict[int, tuple[SimJob, str, float, str]] = {}
        #: incarnation -> (the order it took its job in, the job's id): what it holds.
        self.holding: dict[str, tuple[int, int]] = {}
        self._takes = itertools.count()
        self.cold_loads = 0
        #: incarnation -> when it died (its runs' leases lapse from then).
        self.died: dict[str, float] = {}
        #: gpulanes' preemption (None: plain workers run every job to its end).
        self.preemptor: RunWatcher | None = None

    def start_all(self) -> None:
        """Every (started) worker asks for its first job."""
        for worker in self.workers.values():
            self.take(worker)

    def push(self, job: SimJob, key: str, front: bool = False) -> None:
        """Publish or move ``job`` into list ``key``; a worker blocked on it takes it."""
        self.lists.push(job, key, front)
        node = node_of_key(key)
        if node is not None:
            if node in self.idle:
                self.take(self.workers[node])
        elif self.idle:
            self.take(self.workers[next(iter(self.idle))])
        if self.preemptor is not None and job.key is not None and (
                job.lane == FAST or first_level(job.lane, step_of(key))):
            self.preemptor.pushed(key)  # still waiting: one worker is told of it

    def take(self, worker: SimWorker, ended_at: float | None = None) -> None:
        """``worker`` is free: it takes the first job of its lists, or blocks.
        ``ended_at``: its last job ended then, ``unmeasured_s`` ago; a job that waited in
        its lane since then tells the worker its time between jobs, as a real worker
        measures it (``Runtime.between_jobs``)."""
        lists, depth = self.lists, self.lists.list_depth
        for key in worker.order:
            if key in depth:
                job = lists.pop(key)
                if ended_at is not None and job.lane_since <= ended_at:
                    worker.runtime.between_jobs((self.clock.now - ended_at) * 1000)
                woken = self.idle.pop(worker.host, False) is None
                self._start(worker, job, key, next(self._pickups) if woken else 0.0)
                return
        self.idle[worker.host] = None

    def _start(self, worker: SimWorker, job: SimJob, key: str, pickup_s: float) -> None:
        now, spec = self.clock.now + pickup_s, self.specs[job.arrival.model]
        job.token += 1
        job.attempts += 1
        job.started_at, job.worker, job.priority = now, worker.host, step_of(key)
        job.cold = job.arrival.model not in worker.warm
        load_s = spec.load_s if job.cold else 0.0
        self.cold_loads += job.cold
        worker.load(job.arrival.model, load_s, spec.memory_mb)
        if load_s:  # reported as loading until it is warm (``Runtime.model``)
            worker.runtime.loading = {job.arrival.model}
            self.clock.at(now + load_s, self._loaded, worker, job, job.token)
        worker.runtime.job_started(job.lane, first_level(job.lane, job.priority))
        worker.changed()
        worker.running = job
        self.held[job.id] = (job, worker.incarnation, now, key)
        self.holding[worker.incarnation] = (next(self._takes), job.id)
        job.run_began_at = now + load_s
        run_s = job.arrival.run_s * (1 - job.steps_done / job.arrival.steps)
        # the worker's time on it, but for ``unmeasured_s`` at its end (the real postrun):
        # the span it measures (prerun to postrun)
        busy_s = load_s + run_s + self.overhead_s - self.unmeasured_s
        self.clock.at(now + busy_s, self._finish, worker, job, job.token, worker.incarnation,
                      busy_s)
        if self.preemptor is not None:
            self.preemptor.offer(worker, job)

    def _loaded(self, worker: SimWorker, job: SimJob, token: int) -> None:
        if worker.running is job and job.token == token:
            worker.runtime.loading = set()
            worker.changed()

    def _finish(self, worker: SimWorker, job: SimJob, token: int, incarnation: str,
                busy_s: float) -> None:
        if token != job.token or not worker.alive or worker.incarnation != incarnation:
            return  # that run died with its worker or stepped aside: the job runs again
        job.finished_at, job.served = self.clock.now, job.served + 1
        worker.runtime.job_finished(job.lane, max(0.0, busy_s) * 1000,
                                    job.arrival.model, job.arrival.cost,
                                    first_level(job.lane, job.priority))
        worker.changed()
        del self.held[job.id]
        del self.holding[incarnation]
        worker.running = None
        self.on_done(job)
        if self.unmeasured_s:  # the ack, the next fetch: then the next job
            self.clock.after(self.unmeasured_s, self._next, worker, worker.incarnation,
                             self.clock.now)
        else:
            self.take(worker)

    def step_aside(self, worker: SimWorker, job: SimJob, own_queue: str) -> None:
        """The run stops at a step boundary (preempted): its job to the front of
        ``own_queue`` (the worker's own queue of its lane) at its own level, the worker
        takes the next."""
        job.token += 1  # the run's finish event is void
        worker.runtime.job_finished(job.lane, None, first=first_level(job.lane, job.priority))
        worker.changed()
        del self.held[job.id]
        del self.holding[worker.incarnation]
        worker.running = None
        self.push(job, list_key(own_queue, job.priority), front=True)
        self.clock.after(self.overhead_s, self._next, worker, worker.incarnation)

    def _next(self, worker: SimWorker, incarnation: str, ended_at: float | None = None) -> None:
        """After a run's teardown: the next job, unless the worker died."""
        if worker.alive and worker.incarnation == incarnation and worker.running is None:
            self.take(worker, ended_at)

    def kill(self, host: str) -> None:
        """The worker dies: it stops pushing stats and taking jobs; what it runs stays
        held by its incarnation until someone puts it back."""
        worker = self.workers[host]
        worker.alive, worker.died_at, worker.running = False, self.clock.now, None
        self.died[worker.incarnation] = self.clock.now
        self.idle.pop(host, None)

    def restart(self, host: str) -> None:
        """A new process under the same name."""
        worker = self.workers[host]
        worker.start(self.clock.now)
        self.take(worker)

    def put_back(self, job_id: int) -> None:
        """A held job of a dead incarnation goes back to the front of its list."""
        job, who, _, key = self.held.pop(job_id)
        del self.holding[who]
        self.push(job, key, front=True)
