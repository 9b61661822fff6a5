"""Worker concerns as small hook objects wired to Celery signals from one list.

Add a concern (VRAM guard, metrics, ...) by writing a hook and listing it in
``HOOKS``; nothing else in the worker changes.
"""
from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections import defaultdict, deque
from typing import Any, Callable, Iterable

from celery import bootsteps, signals
from celery.utils.dispatch import Signal

from gpu_worker import control  # noqa: F401  registers the heartbeat command
from gpu_worker.devices import worker_device
from gpu_worker.health import HEALTH_HOOK
from gpu_worker.hook import Hook
from gpu_worker.lease import Lease, renew
from gpu_worker.no_eviction import NoEviction
from gpu_worker.preempt import PREEMPTION
from gpu_worker.runtime import RUNTIME
from gpu_worker.stats import StatsPush
from gpu_worker.stopping import BoundedStop
from gpu_worker.stuck import WATCHDOG
from routing.names import JOB_TASK_NAMES, LANES, lane_of
from tasks.broker.keys import HOLDERS_KEY, UNACKED_INDEX_KEY
from tasks.broker.message import Job, JobMessage
from tasks.broker.outage import OUTAGE
from tasks.broker.holder import note_unanswered, set_holder, unanswered_since
from tasks.broker.transport import put_back_held
from tasks.errors import ModelError
from tasks.jobs import catalog
from tasks.settings import settings

log = logging.getLogger(__name__)
#: Exit status of a worker whose models failed to load (EX_CONFIG).
EXIT_NOT_WARM = 78


class OwnQueues(Hook):
    """Declare this worker's own lane queues (``fast.gpu0@host`` ...) before Celery
    selects the ``-Q`` list; only the three shared lanes are in ``task_queues``."""

    def handlers(self) -> dict[Signal, Callable[..., Any]]:
        return {signals.celeryd_init: self.on_celeryd_init}

    def on_celeryd_init(self, instance: Any = None, options: Any = None, **_: Any) -> None:
        queues = instance.app.amqp.queues
        wanted = options.get("queues") or []
        for name in wanted.split(",") if isinstance(wanted, str) else wanted:
            if name and name not in queues and lane_of(name) in LANES:
                queues.add(name, exchange=name, routing_key=name)


class WarmModels(Hook):
    """Pin torch, then load and warm the warm models (GPULANES_WARM_MODELS, else the
    first GPULANES_MODEL_SLOTS of GPULANES_MODELS).

    Runs in ``worker_init``: in the worker's main process, before the
    consumer starts, so no job is consumed until the models are warm.
    """

    def handlers(self) -> dict[Signal, Callable[..., Any]]:
        return {signals.worker_init: self.on_worker_init}

    def on_worker_init(self, sender: Any = None, **_: Any) -> None:
        try:  # every model's class imports (its Input is what jobs are checked with)
            for name in settings.models:
                catalog.spec(name)
        except ModelError:
            log.exception("a model in GPULANES_MODELS cannot be imported; this worker exits")
            raise SystemExit(EXIT_NOT_WARM) from None
        import torch

        torch.set_num_threads(settings.torch_threads)
        device = worker_device(settings.device)
        RUNTIME.configure(sender.hostname, device, settings.models, settings.model_dir,
                          settings.model_slots)
        try:
            for name in settings.warm:
                RUNTIME.model(name)
        except Exception:
            # Celery swallows exceptions from signal handlers; a worker that
            # cannot warm its models must not consume, so leave for real.
            log.exception("cannot warm the models; this worker exits")
            raise SystemExit(EXIT_NOT_WARM) from None


class JobStats(Hook):
    """Count in-flight jobs and measure service time for the heartbeat.

    Keyed by pool thread: prerun and postrun of one run share a thread, while
    two copies of one job id may run at once on different threads.
    """

    def __init__(self) -> None:
        self._began: dict[int, tuple[str, float, str, float]] = {}
        #: (wall, perf_counter) times of job ends whose slot no job has taken since,
        #: oldest first: a start takes the slot that freed first.
        self._ended: deque[tuple[float, float]] = deque(maxlen=64)
        self._ended_lock = threading.Lock()

    def handlers(self) -> dict[Signal, Callable[..., Any]]:
        return {signals.task_prerun: self.on_prerun, signals.task_postrun: self.on_postrun}

    def on_prerun(self, task: Any, **_: Any) -> None:
        if task.name in JOB_TASK_NAMES:
            lane = lane_of(task.request.delivery_info.get("routing_key") or "unknown")
            model, cost = Job.model_and_cost(task.request.kwargs)
            with self._ended_lock:
                ended = self._ended.popleft() if self._ended else None
            now = time.perf_counter()
            waiting_since = JobMessage.lane_clock_of(task.request.kwargs)
            if ended is not None and waiting_since is not None and waiting_since <= ended[0]:
                RUNTIME.between_jobs((now - ended[1]) * 1000)  # it waited in its lane then
            self._began[threading.get_ident()] = (lane, now, model, cost)
            RUNTIME.job_started(lane)

    def on_postrun(self, state: str | None = None, **_: Any) -> None:
        began = self._began.pop(threading.get_ident(), None)
        if began is not None:
            lane, at, model, cost = began
            now = time.perf_counter()
            with self._ended_lock:
                self._ended.append((time.time(), now))
            ok = state == "SUCCESS"
            RUNTIME.job_finished(lane, (now - at) * 1000 if ok else None, model, cost)


class HeldJobs(Hook):
    """Which broker messages this worker process holds, and the lease of each run.

    kombu's take records in Redis which process holds each message
    (``tasks.broker.transport``): if this process dies, beat's health check puts its
    messages back at once instead of after the visibility timeout. Here the
    process keeps its own list, so it can keep them fresh (:class:`KeepHeld`)
    and notice a record of its own in Redis that it does not hold (an ack lost
    in an outage, a record restored from the AOF): such an orphan goes back to
    its lane, or is dropped if its job finished.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._received: dict[str, deque[str]] = defaultdict(deque)
        self._running: dict[int, tuple[str, str]] = {}  # pool thread -> (tag, job id)
        self._leases: dict[int, Lease] = {}  # pool thread -> its run's lease

    def handlers(self) -> dict[Signal, Callable[..., Any]]:
        return {signals.task_received: self.on_received, signals.task_prerun: self.on_prerun,
                signals.task_postrun: self.on_postrun, signals.task_revoked: self.on_revoked,
                signals.worker_shutdown: self.on_shutdown}

    def on_received(self, request: Any = None, **_: Any) -> None:
        with self._lock:  # a retry's message (same id) may arrive before the run ends
            self._received[request.id].append(request.message.delivery_tag)

    def on_revoked(self, request: Any = None, **_: Any) -> None:
        """A message dropped before it ran (revoked) is no longer held."""
        tag = (getattr(request, "properties", None) or {}).get("delivery_tag")
        with self._lock:
            tags = self._received.get(getattr(request, "id", None))
            if tags is not None and tag in tags:
                tags.remove(tag)
                if not tags:
                    del self._received[request.id]

    def on_prerun(self, task_id: str, task: Any = None, **_: Any) -> None:
        # the tag of the message that runs: another copy of the job (a retry's, a
        # deferred one) may wait here for its countdown, received earlier
        tag = (getattr(getattr(task, "request", None), "properties", None) or {}).get(
            "delivery_tag")
        with self._lock:
            tags = self._received.get(task_id)
            if tags:
                if tag in tags:
                    tags.remove(tag)
                else:
                    tag = tags.popleft()
                self._running[threading.get_ident()] = (tag, task_id)
                if not tags:
                    del self._received[task_id]

    def on_postrun(self, **_: Any) -> None:
        with self._lock:
            ran = self._running.pop(threading.get_ident(), None)
            self._leases.pop(threading.get_ident(), None)
        if ran is not None:  # its message is settled next, or the worker is stuck
            WATCHDOG.ended(*ran, time.monotonic())

    def keep_only(self, job_ids: set[str]) -> int:
        """Forget the messages received and not yet running, but for ``job_ids``'s; how
        many were forgotten."""
        with self._lock:
            gone = [i for i in self._received if i not in job_ids]
            for job_id in gone:
                del self._received[job_id]
        return len(gone)

    def running(self) -> int:
        """How many runs are in flight in this process."""
        with self._lock:
            return len(self._running)

    def attach(self, lease: Lease) -> None:
        """The run on this pool thread holds ``lease``: keep it extended."""
        with self._lock:
            self._leases[threading.get_ident()] = lease

    def held(self) -> tuple[list[str], list[Lease]]:
        """(delivery tags of every message this process holds, the leases of its runs);
        a run given up as hung (:meth:`hung`) holds neither any more."""
        with self._lock:
            waiting = [tag for tags in self._received.values() for tag in tags]
            running = [(tag, self._leases.get(thread)) for thread, (tag, _)
                       in self._running.items()]
        kept = [(tag, lease) for tag, lease in running if not (lease and lease.abandoned)]
        return waiting + [tag for tag, _ in kept], [lease for _, lease in kept if lease]

    def hung(self) -> list[tuple[str, Lease]]:
        """(tag, lease) of each run past its lease's time limit and not yet given up."""
        with self._lock:
            return [(tag, lease) for thread, (tag, _) in self._running.items()
                    if (lease := self._leases.get(thread)) and lease.overdue()
                    and not lease.abandoned]

    def on_shutdown(self, **_: Any) -> None:
        if not WATCHDOG.takes_writes:  # Redis away: beat settles what is left once it is
            return
        with contextlib.suppress(*OUTAGE):
            settle_orphans(set(self.held()[0]), confirmed=None)


def put_back_own(tags: Iterable[str]) -> int:
    """Put back messages this process holds but no longer runs; how many went back."""
    from tasks.broker.app import app, redis_client  # the app exists by now

    with app.connection_for_write() as conn:
        return sum(put_back_held(conn.default_channel, redis_client(), tag,
                                 RUNTIME.incarnation, unless_running=False) for tag in tags)


def settle_orphans(held: set[str], confirmed: set[str] | None) -> set[str]:
    """Records in Redis naming this process as holder of a message it does not hold:
    those also among ``confirmed`` (seen last time: not a take in flight; None: all)
    go back to their lane, or are dropped if their job finished. Returns the rest."""
    from tasks.broker.app import redis_client  # the app exists by now

    orphans = {tag for tag, who in redis_client().hgetall(HOLDERS_KEY).items()
               if who == RUNTIME.incarnation and tag not in held}
    due = orphans if confirmed is None else orphans & confirmed
    if due:
        back = put_back_own(due)
        log.warning("%d message(s) recorded as held here but not held (an ack lost in an "
                    "outage?): %d put back in their lanes, the rest finished", len(due), back)
    return orphans - due


#: Rounds of :class:`KeepHeld` that settle orphans once Redis answers after an outage.
SETTLE_ROUNDS = 3


class KeepHeld(Hook):
    """Keep Redis from handing out again a job this worker still holds.

    kombu redelivers an unacked message once its delivery is older than the
    visibility timeout, even while a live worker runs it. So, every
    ``settings.keepalive_s``, this worker dates each message it holds from now (the
    score in kombu's unacked index) and extends the lease of each job it runs
    (``gpu_worker.lease``), in one round trip. A worker that dies stops: its
    jobs come back after the timeout, or at once through beat's health check.
    After Redis failed to answer (an outage, a restart), or left a take or an ack of
    this process unanswered (``tasks.broker.holder.unanswered_since``: Redis may run
    it once it answers, even for a worker that held nothing to keep fresh), it also
    settles the orphans of :func:`settle_orphans`, until none is left to confirm.
    """

    def __init__(self, held: HeldJobs) -> None:
        self.held = held
        self.index_key = UNACKED_INDEX_KEY
        self._suspects: set[str] = set()
        self._settle_rounds = 0

    def handlers(self) -> dict[Signal, Callable[..., Any]]:
        return {signals.worker_ready: self.on_ready}

    def on_ready(self, **_: Any) -> None:
        # Runs until the process ends: a warm shutdown still finishes its jobs.
        threading.Thread(target=self._loop, name="keep-held", daemon=True).start()

    def _loop(self) -> None:
        failed = False
        while True:
            time.sleep(settings.keepalive_s)
            failed = self.round(failed)

    def round(self, failed: bool) -> bool:
        """One round: keep held messages fresh; after an outage (the last round
        ``failed``, or a take or ack of this process was left unanswered) settle orphans
        for ``SETTLE_ROUNDS`` rounds that reach Redis (a write it runs late may come
        after the first), each found twice, a round apart, so a take in flight is not
        one. Whether this round failed."""
        if unanswered_since(clear=True) or failed:
            self._settle_rounds = SETTLE_ROUNDS
        try:
            self.refresh()
            if self._settle_rounds or self._suspects:
                self._suspects = settle_orphans(set(self.held.held()[0]), self._suspects)
                self._settle_rounds = max(0, self._settle_rounds - 1)
        except Exception as exc:  # noqa: BLE001  Redis away: try again next round
            if not failed:  # once an outage, not every round of it
                log.warning("could not keep held jobs fresh (%s: %s); trying every %ss",
                            type(exc).__name__, exc, settings.keepalive_s,
                            exc_info=not isinstance(exc, OUTAGE))
            return True
        if failed:
            log.warning("held jobs kept fresh again")
        return False

    def refresh(self) -> None:
        for tag, lease in self.held.hung():
            give_up_hung(tag, lease)
        tags, leases = self.held.held()
        if tags or leases:
            renew(leases, tags, self.index_key)


def give_up_hung(tag: str, lease: Lease) -> None:
    """A run that held its job past its time limit without a step (a call into the device
    that never returns): its message goes back to its lane for another worker, and the
    run, should it ever wake, finds its lease lost at its next step."""
    lease.abandon()
    put_back_own([tag])
    log.error("job %s: run %d hung (no step for %.0fs past its start); its message is back "
              "in its lane", lease.job_id, lease.attempt, settings.run_hung_s)


class WorkerSetup(Hook):
    """What a worker process sets up once its identity is known (after the models load):
    its takes record it as holder; it listens for fast jobs to step aside for; its
    outcome writes wait out a Redis outage instead of failing the job (until it is told
    to stop: ``gpu_worker.stopping``); the revokes made while it was away are loaded."""

    def handlers(self) -> dict[Signal, Callable[..., Any]]:
        return {signals.worker_init: self.on_worker_init}

    def on_worker_init(self, sender: Any = None, **_: Any) -> None:
        from tasks.broker.control import load_revokes
        from tasks.broker.store import broker_client

        set_holder(RUNTIME.incarnation)
        PREEMPTION.start(broker_client(health_check_interval=30), RUNTIME.hostname,
                         RUNTIME.incarnation)
        # Celery makes a result backend per thread, when the thread first needs one:
        # the setting reaches every pool thread's; this process' own gets it directly.
        conf, backend = sender.app.conf, sender.app.backend
        conf.result_backend_always_retry, conf.result_backend_max_retries = True, float("inf")
        backend.always_retry, backend.max_retries = True, float("inf")
        log.info("%d revoked job(s) loaded", load_revokes())


class ConsumerRestarts(bootsteps.StartStopStep):
    """A consumer that lost its connection drops the messages it received but did not
    run yet (those waiting for their countdown too): Celery counts on the broker to
    hand them out again, but the restore kombu tries as the connection closes fails
    while Redis does not answer. Their records still name this process, which would
    keep them fresh for ever: as the consumer starts again, :class:`HeldJobs` forgets
    them, and :class:`KeepHeld` puts back any such orphan once Redis answers."""

    requires = ("celery.worker.consumer.tasks:Tasks",)

    def start(self, c: Any) -> None:
        if c.restart_count > 0:  # not the first start (0): the connection was lost
            from celery.worker.state import reserved_requests

            dropped = HELD_JOBS.keep_only({request.id for request in reserved_requests})
            note_unanswered()
            log.warning("consumer reconnected: %d job(s) received and not yet run were "
                        "dropped; their records go back to their lanes", dropped)


HELD_JOBS = HeldJobs()
HOOKS: list[Hook] = [NoEviction(), OwnQueues(), WarmModels(), WorkerSetup(), JobStats(),
                     HELD_JOBS, KeepHeld(HELD_JOBS), HEALTH_HOOK, StatsPush(),
                     BoundedStop(HELD_JOBS.running)]


def install() -> None:
    """Wire every hook; called once, as the worker's task module loads."""
    for hook in HOOKS:
        hook.connect()
    from tasks.broker.app import app

    app.steps["consumer"].add(ConsumerRestarts)
