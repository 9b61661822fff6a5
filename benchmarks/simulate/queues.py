"""The broker's lists as gpulanes' transport lays them out, and the jobs in them.

A lane is a set of Redis lists: the shared lane and each worker's own queue of it
(``routing.names.worker_queue``), each split by kombu priority step (``routing.names.
RELAX_PRIORITIES``: an account's level). A worker reads its lists in the order its take
names them: lane by lane, within a lane level by level, each level in ``-Q`` order
(``tasks.broker.bindings.lists``). Here a list is a deque whose left end runs next; "the
front" of a list is that end.
"""
from __future__ import annotations

import heapq
import itertools
from collections import Counter, deque
from dataclasses import dataclass
from typing import Iterable, Iterator

from routing.names import FAST, LANES, RELAX_PRIORITIES, lane_of, worker_queues
from tasks.broker.keys import PRIORITY_SEP, due_clock, lane_of_key

from benchmarks.simulate.workload import Arrival


@dataclass(eq=False)
class SimJob:
    """One job through its life: where it waits, where and when it ran."""

    id: int
    arrival: Arrival
    lane: str
    downgradable: bool
    submitted_at: float
    lane_since: float
    priority: int = 0
    node: str | None = None
    key: str | None = None
    downgraded_from: str | None = None
    reason: str | None = None
    started_at: float | None = None
    finished_at: float | None = None
    worker: str | None = None
    cold: bool = False
    attempts: int = 0
    served: int = 0
    #: Bumped by every take: a finish event of an earlier attempt is stale.
    token: int = 0
    #: Bumped by every push: an entry of the due index made before is stale.
    pushes: int = 0
    #: The lane whose count of its account's waiting jobs it is in (``Lists.waiting``).
    counted: str | None = None
    #: Steps run before a preemption, times preempted, when the current run's steps began.
    steps_done: int = 0
    preemptions: int = 0
    run_began_at: float = 0.0

    @property
    def wait_s(self) -> float:
        """From submission to the start of the run that finished (queued_ms)."""
        return self.started_at - self.submitted_at


def list_key(queue: str, priority: int) -> str:
    """kombu's name of ``queue``'s list for message ``priority`` (``Channel._q_for_pri``;
    the steps are exactly ``RELAX_PRIORITIES``, so a priority is its own step)."""
    return f"{queue}{PRIORITY_SEP}{priority}" if priority else queue


def read_order(node: str, queues: Iterable[str] | None = None) -> list[str]:
    """The lists worker ``node`` reads, first served first (``bindings.lists``)."""
    queues = list(worker_queues(node) if queues is None else queues)
    lanes = [lane for lane in LANES if any(lane_of(q) == lane for q in queues)]
    return [list_key(q, pri) for lane in lanes for pri in RELAX_PRIORITIES
            for q in queues if lane_of(q) == lane]


def step_of(key: str) -> int:
    """The kombu priority step of list ``key`` (``list_key``'s inverse)."""
    return int(key.rpartition(PRIORITY_SEP)[2]) if PRIORITY_SEP in key else 0


def node_of_key(key: str) -> str | None:
    """The worker whose own queue ``key`` is; None for a shared lane."""
    _, _, node = key.split(PRIORITY_SEP, 1)[0].partition(".")
    return node or None


class Lists:
    """Every list, and the counters the queue protocol keeps beside them: jobs per lane and
    per list (``LANE_DEPTHS_KEY``, ``LIST_DEPTHS_KEY``), queued fast jobs per account
    (its fast places)."""

    def __init__(self) -> None:
        self.lists: dict[str, deque[SimJob]] = {}
        self.lane_depth: Counter[str] = Counter()
        self.list_depth: Counter[str] = Counter()
        self.fast_queued: Counter[str] = Counter()
        #: (lane, account) -> its jobs published to that fast or standard lane and
        #: waiting there (``keys.queued_key``: left when taken or moved to another lane).
        self.waiting: Counter[tuple[str, str]] = Counter()
        #: lane -> accounts with jobs counted in ``waiting`` (``keys.waiting_accounts_key``)
        self.waiting_accounts: Counter[str] = Counter()
        #: "<lane>@<priority step>" -> jobs waiting at that level of the lane.
        self.level_depth: Counter[str] = Counter()
        #: Per lane, the due index (``keys.due_key``): (clock, seq, job, its push).
        self.due: dict[str, list[tuple[float, int, SimJob, int]]] = {lane: [] for lane in LANES}
        self._seq = itertools.count()
        self._lanes: dict[str, str] = {}
        #: The lists whose depth changed since ``changed_lists`` last told (a round's
        #: read of the depth counters takes in only those: ``beat.depths``).
        self._changed: dict[str, None] = {}

    def _count(self, job: SimJob, key: str, step: int) -> None:
        lane = job.lane
        self.lane_depth[lane] += step
        self.level_depth[f"{lane}@{key.rpartition(PRIORITY_SEP)[2] or 0}"] += step
        self._changed[key] = None
        depth = self.list_depth[key] + step
        if depth:
            self.list_depth[key] = depth
        else:  # no field for an empty list, as the queue protocol keeps it
            del self.list_depth[key]
        if lane == FAST:
            self.fast_queued[job.arrival.account] += step

    def push(self, job: SimJob, key: str, front: bool = False) -> None:
        """Put ``job`` in list ``key``: at the back (a publish) or the front (a move)."""
        queue = self.lists.get(key)
        if queue is None:
            queue = self.lists[key] = deque()
        queue.appendleft(job) if front else queue.append(job)
        job.key, job.lane = key, self._lane_of(key)
        if job.counted is not None and job.counted != job.lane:  # moved to another lane
            self.uncount(job)
        job.pushes += 1
        self._count(job, key, 1)
        clock = due_clock(key, job.lane_since)
        if clock:
            heapq.heappush(self.due[job.lane], (clock, next(self._seq), job, job.pushes))

    def _lane_of(self, key: str) -> str:
        lane = self._lanes.get(key)
        if lane is None:
            lane = self._lanes[key] = lane_of_key(key)
        return lane

    def pop(self, key: str) -> SimJob | None:
        """The next job of list ``key`` (taken by a worker), or None."""
        queue = self.lists.get(key)
        if not queue:
            return None
        job = queue.popleft()
        self._count(job, key, -1)
        job.key = None
        if job.counted is not None:
            self.uncount(job)
        return job

    def count(self, job: SimJob) -> None:
        """``job`` was published to its fast or standard lane: it waits there."""
        job.counted = job.lane
        self.waiting[(job.lane, job.arrival.account)] += 1
        if self.waiting[(job.lane, job.arrival.account)] == 1:
            self.waiting_accounts[job.lane] += 1

    def uncount(self, job: SimJob) -> None:
        self.waiting[(job.counted, job.arrival.account)] -= 1
        if not self.waiting[(job.counted, job.arrival.account)]:
            self.waiting_accounts[job.counted] -= 1
        job.counted = None

    def remove(self, job: SimJob) -> None:
        """Take ``job`` out of its list (a move; it is near the front: the oldest)."""
        self.lists[job.key].remove(job)
        self._count(job, job.key, -1)
        job.key = None

    def due_before(self, lane: str, cutoff: float, count: int) -> list[SimJob]:
        """Up to ``count`` queued jobs of ``lane`` whose clock is at or before ``cutoff``,
        oldest first, taken out of the index (``zrangebyscore`` of the due index; a job
        a move leaves where it is is indexed again by the caller)."""
        heap, found = self.due[lane], []
        while heap and heap[0][0] <= cutoff and len(found) < count:
            _, _, job, pushes = heapq.heappop(heap)
            if job.key is not None and job.pushes == pushes:
                found.append(job)
        return found

    def front_of(self, key: str, count: int) -> list[SimJob]:
        """The ``count`` jobs of ``key`` that run next (``moves.next_to_run``)."""
        queue = self.lists.get(key, ())
        return [job for _, job in zip(range(count), queue)]

    def youngest(self, key: str, count: int) -> list[SimJob]:
        """The ``count`` jobs of ``key`` that run last, the very last first (``LRANGE
        key 0 count-1``: kombu pushes on the left)."""
        queue = self.lists.get(key, ())
        return [queue[-1 - i] for i in range(min(count, len(queue)))]

    def lengths(self) -> dict[str, dict[str, int]]:
        """Per lane, each list holding jobs and how many (``heartbeat.list_lengths``)."""
        found: dict[str, dict[str, int]] = {lane: {} for lane in LANES}
        for key, count in self.list_depth.items():
            found[self._lanes[key]][key] = count
        return found

    def changed_lists(self) -> list[str]:
        """The lists whose depth changed since the last call (emptied ones included)."""
        changed, self._changed = list(self._changed), {}
        return changed

    def own_keys(self, node: str) -> Iterator[str]:
        """``node``'s own lists that hold jobs."""
        return (key for key in read_order(node) if node_of_key(key) and key in self.list_depth)

    def queued(self) -> int:
        """Jobs waiting in every list."""
        return sum(self.lane_depth.values())
