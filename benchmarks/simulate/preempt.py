"""Preemption as gpulanes' workers do it (``gpu_worker.preempt``), on the virtual clock.

A fast job pushed to a list tells ONE worker (``lua/fast_news.lua``): the worker whose
own queue it is, else the best preemptible run of the index (relaxed runs before
standard ones, later levels first, the latest begun first: ``ZPOPMAX``), taken off the
index; a first-level standard job pushed to a worker's own queue tells that worker. The
told run looks at its next step boundary (``Preemption.wanted``): a fast run, or one
preempted ``max_preemptions`` times, may not stop (and one expecting less than
``preempt_min_left_s`` still to run does not look at all), and hands the fast jobs of its
worker's own queue to the front of the shared fast lane, telling another, unless it ends
within the fast lane's budget (they wait for it); else, if a fast job it could take still
waits (``lua/preempt_claim.lua``), or, for a run heavier than standard's first level, a
first-level job of its worker's own queue, it stops: its job's next copy goes to the front
of its worker's own queue of its lane, at its level (a resumable model: it resumes at
that step), and the worker takes the job that waits. The decisions live in Redis
scripts and the worker's threads: none is a pure function to call.
"""
from __future__ import annotations

import heapq
import math
from typing import TYPE_CHECKING

from routing.names import FAST, FIRST_STEPS, STANDARD, heavier, worker_queue
from tasks.broker.keys import HEAVIER_SCORE, lane_keys, preemptible_score

from benchmarks.simulate.queues import SimJob, list_key, node_of_key

if TYPE_CHECKING:
    from benchmarks.simulate.cluster import Cluster, SimWorker


class Preemptor:
    """The index of preemptible runs, and each told run's step-boundary check."""

    def __init__(self, cluster: Cluster, max_preemptions: int, min_left_s: float,
                 hand_over_left_s: float = 0.0) -> None:
        self.cluster, self.max_preemptions = cluster, max_preemptions
        self.min_left_s, self.hand_over_left_s = min_left_s, hand_over_left_s
        # (-its score but for time, -begun, host, job token): ZPOPMAX order
        # (``gpu_worker.preempt.preemptible_score``); stale entries skipped
        self._index: list[tuple[int, float, str, int]] = []
        self.preempted = 0
        self.handed_over = 0

    def may_stop(self, job: SimJob) -> bool:
        return job.lane != FAST and job.preemptions < self.max_preemptions

    def offer(self, worker: SimWorker, job: SimJob) -> None:
        """A run began: index it if it may step aside (``Preemption.offer``)."""
        if self.may_stop(job):
            heapq.heappush(self._index, (-preemptible_score(job.lane, job.priority, 0.0),
                                         -self.cluster.clock.now, worker.host, job.token))

    def pushed(self, key: str) -> None:
        """A fast job was pushed to ``key``, or a first-level standard one to a worker's
        own queue: tell one worker."""
        node = node_of_key(key)
        if node is not None:
            self._tell(self.cluster.workers[node], own=True)
            return
        least = -math.inf if key.startswith(FAST) else HEAVIER_SCORE
        workers, index = self.cluster.workers, self._index
        while index and -index[0][0] >= least:
            _, _, host, token = heapq.heappop(index)
            worker = workers[host]
            if worker.alive and worker.running is not None and worker.running.token == token:
                self._tell(worker, own=False)
                return

    def _tell(self, worker: SimWorker, own: bool) -> None:
        job = worker.running
        if job is None or not worker.alive:
            return
        worker.told_own = worker.told_own or own
        run = (job.id, job.token)  # this run (every job's first run has token 1)
        if worker.told_run == run:
            return  # its next boundary is already due to look
        worker.told_run = run
        at = self._next_boundary(job)
        if at is not None:
            self.cluster.clock.at(at, self._boundary, worker, job, job.token)

    def _next_boundary(self, job: SimJob) -> float | None:
        """The next step boundary of ``job``'s run; None when its last step runs."""
        now, step_s = self.cluster.clock.now, job.arrival.run_s / job.arrival.steps
        begun = job.run_began_at
        done = max(0, math.floor((now - begun) / step_s) + 1) if now >= begun else 1
        if job.steps_done + done >= job.arrival.steps:
            return None
        return begun + done * step_s

    def _boundary(self, worker: SimWorker, job: SimJob, token: int) -> None:
        if not worker.alive or worker.running is not job or job.token != token:
            return
        if self._left_s(job) < self.min_left_s:
            return  # about to end: it runs on, the news unread (``steps._long_left``)
        own, worker.told_own, worker.told_run = worker.told_own, False, None
        if not self.may_stop(job):
            if own and self._left_s(job) >= self.hand_over_left_s:
                self._hand_over(worker)  # a run ending within the fast budget keeps them
            return
        keys = (*lane_keys(worker_queue(FAST, worker.host)), *lane_keys(FAST))
        if heavier(job.lane, job.priority):  # it steps aside for first-level jobs too
            keys += tuple(list_key(queue, step) for step in FIRST_STEPS
                          for queue in (worker_queue(STANDARD, worker.host), STANDARD))
        if any(key in self.cluster.lists.list_depth for key in keys):
            self._stop(worker, job)

    def _left_s(self, job: SimJob) -> float:
        """What the run expects still to run at this boundary (its pace: its steps')."""
        step_s = job.arrival.run_s / job.arrival.steps
        done = round((self.cluster.clock.now - job.run_began_at) / step_s)
        return step_s * (job.arrival.steps - job.steps_done - done)

    def _hand_over(self, worker: SimWorker) -> None:
        """The worker's own fast jobs to the front of the shared fast lane, told again."""
        lists = self.cluster.lists
        for own, shared in zip(lane_keys(worker_queue(FAST, worker.host)), lane_keys(FAST)):
            jobs = lists.front_of(own, len(lists.lists.get(own, ())))
            for job in reversed(jobs):
                lists.remove(job)
                job.node = None
                self.cluster.push(job, shared, front=True)
            self.handed_over += len(jobs)

    def _stop(self, worker: SimWorker, job: SimJob) -> None:
        """The run steps aside at this boundary; its job resumes later at this step."""
        now, step_s = self.cluster.clock.now, job.arrival.run_s / job.arrival.steps
        job.steps_done += round((now - job.run_began_at) / step_s)
        job.preemptions += 1
        self.preempted += 1
        self.cluster.step_aside(worker, job, worker_queue(job.lane, worker.host))

