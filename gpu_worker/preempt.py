"""Preemption: a running relaxed (then standard) job steps aside at a step boundary
for a fast job that waits, and resumes after it; a relaxed run, or a standard one past
the lane's first level, steps aside the same way for a first-level standard job
(``routing.names.FIRST_STEPS``: an account of least recent usage), so that within
standard too a light account waits a step, not a heavy account's whole job.

How a worker hears of a waiting fast job within a step, with no poll: a worker that
begins a preemptible run enters an index of such runs (relaxed ones ranked before
standard ones, the latest begun first); the publish script tells each fast job
pushed to ONE worker, on that worker's own pub/sub channel: the worker whose own
queue it is in, else the best-ranked run of the index, which it takes off the index
(``lua/fast_news.lua``). A first-level standard job is told the same way, only to a
heavier run. So a job costs one message to one subscriber, and wakes one worker,
whatever the size of the fleet. A thread of each worker listens; a run's
step guard reads what it heard, in memory. Only once told does the run ask Redis
(``lua/preempt_claim.lua``, one call) whether a fast job it could take still waits
and is not spoken for by another preempting worker; if so it records its claim and
stops (``tasks.worker.generate``). A fast job is never preempted, and a job at most
``GPULANES_MAX_PREEMPTIONS`` times.

What stops, and how it comes back: a model that declares ``resumable`` hands its state
at each step (the demo model: its latents after the step); the run keeps the last one
here, in this worker's memory (:data:`SUSPENDED`), and its job's next copy goes to the
front of this worker's own queue of its lane, at its own level, so the worker runs the
job it stepped aside for (and any lighter ones) and then picks its job up where it
stopped: the same output, bit for bit. A model that is only
``preemptible`` starts again from the front of its shared lane. Should the worker die
meanwhile, beat puts its queue back in the shared lanes: the job runs again from the
start elsewhere, and nothing is lost. Preemption applies to a worker that runs one job
at a time (no batching): a batched pass runs to its end.
"""
from __future__ import annotations

import logging
import threading
import time
from collections import OrderedDict
from typing import Any

import redis

from routing.names import FAST, FIRST_STEPS, RELAX_PRIORITIES, STANDARD, worker_queue
from tasks.broker import scripts
from tasks.broker.keys import (
    FAST_NEWS_PREFIX,
    PREEMPT_CLAIMS_KEY,
    PREEMPTIBLE_KEY,
    fast_news_channel,
    lane_keys,
    preemptible_score,
)
from tasks.settings import settings

log = logging.getLogger(__name__)
#: How long a claim counts if its worker never begins another run (it died).
CLAIM_S = 10.0
#: Suspended jobs' states one worker keeps at most (the oldest is dropped: that job
#: starts again from its first step).
MAX_SUSPENDED = 4


class Preempted(Exception):
    """Raised between steps: the run stops for a waiting fast job, or (``leaving``) for
    its worker is stopping. ``state``: what a resumable model handed at that boundary
    (None: it starts again)."""

    def __init__(self, step: int, steps: int | None = None, state: Any = None,
                 leaving: bool = False) -> None:
        why = "its worker is stopping" if leaving else "a waiting fast job"
        super().__init__(f"preempted at step {step} for {why}")
        self.step, self.steps, self.state, self.leaving = step, steps, state, leaving


class Preemption:
    """What this worker process heard of waiting fast (and first-level standard) jobs,
    and its claims."""

    def __init__(self) -> None:
        self.told_at = 0.0      #: monotonic time of the latest news
        self.fast_told_at = 0.0  #: ... of a fast job
        self.own_told_at = 0.0  #: ... of a fast job pushed to this worker's own queue
        self.asked_for = 0.0    #: the news last asked about (a no is not asked again)
        self.claimed = False
        self.offered = False    #: this worker's run is in the index of preemptible runs
        self.identity, self.hostname = "", ""
        self._mine: frozenset[str] = frozenset()
        self._shared: frozenset[str] = frozenset()
        # standard's first-level lists: the shared lane's, its own queue's, both
        self._first_shared: tuple[str, ...] = ()
        self._first_own: tuple[str, ...] = ()
        self._first: frozenset[str] = frozenset()

    def start(self, client: redis.Redis, hostname: str, identity: str) -> None:
        """Listen for fast jobs pushed where this worker takes them (a daemon thread);
        nothing to listen for with ``GPULANES_PREEMPT`` off."""
        self.hostname, self.identity = hostname, identity
        if not settings.preempt:
            return
        self._first_shared, self._first_own = first_lists(STANDARD), \
            first_lists(worker_queue(STANDARD, hostname))
        self._first = frozenset((*self._first_shared, *self._first_own))
        self._shared = frozenset((*lane_keys(FAST), *self._first_shared))
        self._mine = self._shared | frozenset((*lane_keys(worker_queue(FAST, hostname)),
                                               *self._first_own))
        threading.Thread(target=self._listen, args=(client,), daemon=True,
                         name="fast-news").start()

    def _listen(self, client: redis.Redis) -> None:
        while True:
            try:
                pubsub = client.pubsub(ignore_subscribe_messages=True)
                pubsub.subscribe(fast_news_channel(self.hostname))
                self._told(own=True)  # what was pushed while not listening: ask once
                while True:
                    pubsub.check_health()  # a dead connection raises: listen anew
                    message = pubsub.get_message(timeout=1.0)
                    if message and (key := _text(message["data"])) in self._mine:
                        self._told(own=key not in self._shared, fast=key not in self._first)
            except Exception as exc:  # noqa: BLE001  never a deaf worker: listen again
                log.info("fast-job news interrupted (%s: %s); listening again",
                         type(exc).__name__, exc)
                time.sleep(1.0)

    def _told(self, own: bool, fast: bool = True) -> None:
        now = time.monotonic()
        if fast:  # first: a guard that sees the news sees whose it is
            self.fast_told_at = now
            if own:
                self.own_told_at = now
        self.told_at = now

    def wanted(self, lane: str, preempted: int, preemptible: bool = True,
               left_s: float | None = None, heavier: bool = False) -> bool:
        """At a step boundary of a run in ``lane`` preempted ``preempted`` times so far
        (expecting ``left_s`` still to run; None: unknown): whether it is to stop now for
        a waiting fast job, or (``heavier``: a relaxed run, or a standard one past the
        first level) for a waiting first-level standard job. A run
        that may not stop hands the fast jobs of this worker's own queue to the shared
        lane, for another worker, unless it ends within the fast lane's budget: they
        wait it out here, their model warm, where elsewhere a worker that is free first,
        whatever it holds, would take them (a cold load, and a model evicted) while this
        run's model sits unused once it ends."""
        told, last = self.told_at, self.asked_for
        if told <= last:
            return False
        if lane == FAST or not (preemptible and settings.preempt) \
                or preempted >= settings.max_preemptions:
            self.asked_for = told
            if self.own_told_at > last and (left_s is None or left_s >= settings.max_wait_s[FAST]):
                self._hand_over()
            return False
        self.asked_for = told
        if not heavier and self.fast_told_at <= last:
            return False  # first-level news only: not for a first-level run
        try:
            self.claimed = bool(self._claim(heavier))
        except redis.RedisError as exc:  # not knowing, run on: the fast job waits a job
            log.info("preemption not claimed (%s)", exc)
            return False
        return self.claimed

    def _hand_over(self) -> None:
        """This worker's own fast jobs to the front of the shared fast lane, told again."""
        from tasks.broker.app import redis_client
        from tasks.broker.moves import readdress

        try:
            client = redis_client()
            own = worker_queue(FAST, self.hostname)
            moved = sum(readdress(client, mine, shared, FAST)  # each level to its own
                        for mine, shared in zip(lane_keys(own), lane_keys(FAST)))
            if moved:  # one other worker is told of them
                scripts.run(client, "fast_tell", [PREEMPTIBLE_KEY], [FAST_NEWS_PREFIX, FAST])
                log.info("fast jobs of %s handed to the shared lane: its job runs on", own)
        except redis.RedisError as exc:  # they wait for this worker's job to end
            log.info("fast jobs not handed over (%s)", exc)

    def _claim(self, heavier: bool) -> int:
        from tasks.broker.app import redis_client

        shared, own = lane_keys(FAST), lane_keys(worker_queue(FAST, self.hostname))
        if heavier:  # it steps aside for standard's first level too
            shared, own = shared + list(self._first_shared), own + list(self._first_own)
        return int(scripts.run(redis_client(), "preempt_claim",
                               [PREEMPT_CLAIMS_KEY, *shared, *own],
                               [self.identity, CLAIM_S, len(own)]))

    def offer(self, lane: str, preempted: int, step: int = 0) -> None:
        """A run that may step aside began here (in ``lane`` at priority ``step``,
        preempted ``preempted`` times so far): enter the index of preemptible runs, so
        that a fast job pushed to the shared lane may be told to this worker (relaxed runs
        first, then standard ones, the latest level first, the latest begun first: the
        least work set aside, of the heaviest users)."""
        if lane == FAST or not settings.preempt or preempted >= settings.max_preemptions:
            return
        from tasks.broker.app import redis_client

        try:
            redis_client().zadd(PREEMPTIBLE_KEY, {self.hostname: preemptible_score(
                lane, step, time.time())})
            self.offered = True
        except redis.RedisError as exc:  # told of nothing shared: its own queue still is
            log.info("not offered for preemption (%s)", exc)

    def withdraw(self) -> None:
        """The run ended (or stepped aside): out of the index, if it is still there."""
        if not self.offered:
            return
        self.offered = False
        from tasks.broker.app import redis_client

        try:
            redis_client().zrem(PREEMPTIBLE_KEY, self.hostname)
        except redis.RedisError:  # a stale entry is dropped by the first news it gets
            pass

    def run_begins(self) -> None:
        """A run begins here: a claim this worker made is spent (its fast job, or its
        own suspended job if the fast one went elsewhere)."""
        if not self.claimed:
            return
        self.claimed = False
        from tasks.broker.app import redis_client

        try:
            redis_client().zrem(PREEMPT_CLAIMS_KEY, self.identity)
        except redis.RedisError:  # it lapses after CLAIM_S
            pass


class Suspended:
    """States of this worker's preempted jobs, until each resumes (or is dropped)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._states: OrderedDict[str, tuple[int, Any]] = OrderedDict()

    def keep(self, job_id: str, step: int, state: Any) -> None:
        with self._lock:
            self._states[job_id] = (step, state)
            while len(self._states) > MAX_SUSPENDED:
                dropped, _ = self._states.popitem(last=False)
                log.info("job %s's preempted state dropped (over %d kept): it starts "
                         "again from its first step", dropped, MAX_SUSPENDED)

    def take(self, job_id: str) -> tuple[int, Any] | None:
        """(step, state) a preempted job stopped at, if this worker kept it; gone after."""
        with self._lock:
            return self._states.pop(job_id, None)

    def __len__(self) -> int:
        return len(self._states)


def first_lists(queue: str) -> tuple[str, ...]:
    """The lists of a standard ``queue``'s first level (``FIRST_STEPS``)."""
    return tuple(key for key, step in zip(lane_keys(queue), RELAX_PRIORITIES)
                 if step in FIRST_STEPS)


def _text(data: Any) -> str:
    return data.decode() if isinstance(data, bytes) else str(data)


#: This worker process's news of fast jobs, and its suspended jobs.
PREEMPTION = Preemption()
SUSPENDED = Suspended()
