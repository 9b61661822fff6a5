"""Worker concerns as small hook objects wired to Celery signals from one list.

Add a concern (VRAM guard, metrics, ...) by writing a hook and listing it in
``HOOKS``; nothing else in the worker changes.
"""
from __future__ import annotations

import logging
import threading
import time
from collections import defaultdict, deque
from typing import Any, Callable

from celery import bootsteps, signals
from celery.utils.dispatch import Signal

from gpu_worker import control  # noqa: F401  registers the heartbeat command
from gpu_worker.devices import worker_device
from gpu_worker.health import HEALTH_HOOK
from gpu_worker.hook import Hook
from gpu_worker.lease import Lease, renew
from gpu_worker.memory import check_warm, default_warm, device_budget_mb
from gpu_worker.no_eviction import NoEviction
from gpu_worker.preempt import PREEMPTION
from gpu_worker.runtime import RUNTIME
from gpu_worker.stats import StatsPush
from gpu_worker.stopping import BoundedStop
from gpu_worker.stuck import WATCHDOG
from routing.names import JOB_TASK_NAMES, LANES, first_level, lane_of
from tasks.broker.holder import TOKENS, give_back, give_back_all_but, set_holder
from tasks.broker.message import Job, JobMessage
from tasks.broker.outage import OUTAGE
from tasks.errors import ConfigError, ModelError
from tasks.jobs import catalog
from tasks.settings import BUILT_IN_MODELS, settings

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
    """Pin torch, then load and warm the warm models (GPULANES_WARM_MODELS, else
    GPULANES_MODELS in order while their declared sizes fit: ``memory.default_warm``);
    warm models that do not fit the device's budget stop the worker (``ConfigError``).

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
                          device_budget_mb(device, settings.model_memory_mb))
        try:
            names = warm_set(device)
            for name in names:
                RUNTIME.model(name)
            # sizes measured at load count too: none may have pushed another out
            check_warm({name: RUNTIME.size_of(name) for name in names}, RUNTIME.budget_mb,
                       _budget_from(device))
        except ConfigError as exc:
            log.error("%s; this worker exits", exc)
            raise SystemExit(EXIT_NOT_WARM) from None
        except Exception:
            # Celery swallows exceptions from signal handlers; a worker that
            # cannot warm its models must not consume, so leave for real.
            log.exception("cannot warm the models; this worker exits")
            raise SystemExit(EXIT_NOT_WARM) from None


def warm_set(device: str) -> tuple[str, ...]:
    """The models this worker warms at start, checked against its budget:
    ``ConfigError`` naming GPULANES_WARM_MODELS when their declared sizes do not fit."""
    budget, size_of = RUNTIME.budget_mb, RUNTIME.size_of
    names = settings.warm if settings.warm_models or settings.models == BUILT_IN_MODELS \
        else default_warm(settings.warm, size_of, budget)
    check_warm({name: size_of(name) for name in names}, budget, _budget_from(device))
    return names


def _budget_from(device: str) -> str:
    return "free VRAM less a margin" if device.startswith("cuda") \
        else f"GPULANES_MODEL_MEMORY_MB={settings.model_memory_mb}"


class JobStats(Hook):
    """Count in-flight jobs and measure service time for the heartbeat.

    Keyed by pool thread: prerun and postrun of one run share a thread, while
    two copies of one job id may run at once on different threads.
    """

    def __init__(self) -> None:
        self._began: dict[int, tuple[str, float, str, float, bool]] = {}
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
            first = first_level(lane, task.request.delivery_info.get("priority"))
            self._began[threading.get_ident()] = (lane, now, model, cost, first)
            RUNTIME.job_started(lane, first)

    def on_postrun(self, state: str | None = None, **_: Any) -> None:
        began = self._began.pop(threading.get_ident(), None)
        if began is not None:
            lane, at, model, cost, first = began
            now = time.perf_counter()
            with self._ended_lock:
                self._ended.append((time.time(), now))
            ok = state == "SUCCESS"
            RUNTIME.job_finished(lane, (now - at) * 1000 if ok else None, model, cost, first)


class HeldJobs(Hook):
    """Which broker messages this worker process holds, and the lease of each run.

    The queue protocol records in Redis which process holds each message in the step
    that takes it (``tasks.broker.handover``): if this process dies, beat's health
    check gives its messages back at once. Here the process keeps its own list, so it
    can keep its runs' leases extended (:class:`KeepLeases`) and give back the message
    of a run that hung.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._received: dict[str, deque[str]] = defaultdict(deque)
        self._running: dict[int, tuple[str, str]] = {}  # pool thread -> (tag, job id)
        self._leases: dict[int, Lease] = {}  # pool thread -> its run's lease

    def handlers(self) -> dict[Signal, Callable[..., Any]]:
        return {signals.task_received: self.on_received, signals.task_prerun: self.on_prerun,
                signals.task_postrun: self.on_postrun, signals.task_revoked: self.on_revoked}

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

    def keep_only(self, job_ids: set[str]) -> set[str]:
        """Forget the messages received and not yet running, but for ``job_ids``'s; the
        delivery tags of those kept and of the runs."""
        with self._lock:
            for job_id in [i for i in self._received if i not in job_ids]:
                del self._received[job_id]
        return set(self.tags())

    def tags(self) -> list[str]:
        """The delivery tags of every message this process holds: received, or running."""
        with self._lock:
            return ([tag for tags in self._received.values() for tag in tags]
                    + [tag for tag, _ in self._running.values()])

    def running(self) -> int:
        """How many runs are in flight in this process."""
        with self._lock:
            return len(self._running)

    def attach(self, lease: Lease) -> None:
        """The run on this pool thread holds ``lease``: keep it extended."""
        with self._lock:
            self._leases[threading.get_ident()] = lease

    def leases(self) -> list[Lease]:
        """The leases of this process's runs; a run given up as hung (:meth:`hung`) holds
        none any more."""
        with self._lock:
            leases = list(self._leases.values())
        return [lease for lease in leases if not lease.abandoned]

    def hung(self) -> list[tuple[str, Lease]]:
        """(tag, lease) of each run past its lease's time limit and not yet given up."""
        with self._lock:
            return [(tag, lease) for thread, (tag, _) in self._running.items()
                    if (lease := self._leases.get(thread)) and lease.overdue()
                    and not lease.abandoned]


class KeepLeases(Hook):
    """Keep the lease of each job this worker runs, every ``settings.keepalive_s``, in
    one round trip; a run past its time limit without a step is given up
    (:func:`give_up_hung`). A worker that dies stops: its leases lapse, and beat's
    health check gives its messages back."""

    def __init__(self, held: HeldJobs) -> None:
        self.held = held

    def handlers(self) -> dict[Signal, Callable[..., Any]]:
        return {signals.worker_ready: self.on_ready}

    def on_ready(self, **_: Any) -> None:
        # Runs until the process ends: a warm shutdown still hands its jobs on.
        threading.Thread(target=self._loop, name="keep-leases", daemon=True).start()

    def _loop(self) -> None:
        failed = False
        while True:
            time.sleep(settings.keepalive_s)
            failed = self.round(failed)

    def round(self, failed: bool) -> bool:
        """One round; whether it failed (Redis away: tried again next round)."""
        try:
            for tag, lease in self.held.hung():
                give_up_hung(tag, lease)
            if leases := self.held.leases():
                renew(leases)
        except Exception as exc:  # noqa: BLE001  Redis away: try again next round
            if not failed:  # once an outage, not every round of it
                log.warning("could not keep the leases of running jobs (%s: %s); trying "
                            "every %ss", type(exc).__name__, exc, settings.keepalive_s,
                            exc_info=not isinstance(exc, OUTAGE))
            return True
        if failed:
            log.warning("the leases of running jobs are kept again")
        return False


def give_up_hung(tag: str, lease: Lease) -> None:
    """A run that held its job past its time limit without a step (a call into the device
    that never returns): its message goes back to its lane for another worker, and the
    run, should it ever wake, finds its lease lost at its next step."""
    from tasks.broker.app import redis_client  # the app exists by now

    lease.abandon()
    if token := TOKENS.pop(tag, ""):
        give_back(redis_client(), token)
    log.error("job %s: run %d hung (no step for %.0fs past its start); its message is back "
              "in its lane", lease.job_id, lease.attempt, settings.run_hung_s)


class WorkerSetup(Hook):
    """What a worker process sets up once its identity is known (after the models load):
    its takes record it as holder, and what its earlier incarnations held goes back to
    the lanes (one process per name: they are gone); it listens for fast jobs to step
    aside for; its outcome writes wait out a Redis outage instead of failing the job
    (until it is told to stop: ``gpu_worker.stopping``); the revokes made while it was
    away are loaded."""

    def handlers(self) -> dict[Signal, Callable[..., Any]]:
        return {signals.worker_init: self.on_worker_init}

    def on_worker_init(self, sender: Any = None, **_: Any) -> None:
        from tasks.broker.control import load_revokes
        from tasks.broker.store import broker_client

        set_holder(RUNTIME.incarnation)
        give_back_earlier_incarnations()
        PREEMPTION.start(broker_client(health_check_interval=30), RUNTIME.hostname,
                         RUNTIME.incarnation)
        # Celery makes a result backend per thread, when the thread first needs one:
        # the setting reaches every pool thread's; this process' own gets it directly.
        conf, backend = sender.app.conf, sender.app.backend
        conf.result_backend_always_retry, conf.result_backend_max_retries = True, float("inf")
        backend.always_retry, backend.max_retries = True, float("inf")
        log.info("%d revoked job(s) loaded", load_revokes())


def give_back_earlier_incarnations() -> int:
    """Give back what earlier processes under this worker's name held; how many."""
    from tasks.broker.app import redis_client
    from tasks.broker.handover import holders, put_back_all

    client, prefix = redis_client(), f"{RUNTIME.hostname}/"
    earlier = [who for who in holders(client)
               if who.startswith(prefix) and who != RUNTIME.incarnation]
    back = sum(put_back_all(client, who, unless_running=False) for who in earlier)
    if back:
        log.warning("%d job(s) an earlier process of this worker held went back to their "
                    "lanes", back)
    return back


class ConsumerRestarts(bootsteps.StartStopStep):
    """A consumer that lost its connection drops the messages it received but did not
    run yet (those waiting for their countdown too): Celery counts on the broker to
    hand them out again. Their records still name this process: as the consumer starts
    again, :class:`HeldJobs` forgets them and each goes back to the front of its list
    (once Redis answers, before the next take)."""

    requires = ("celery.worker.consumer.tasks:Tasks",)

    def start(self, c: Any) -> None:
        if c.restart_count > 0:  # not the first start (0): the connection was lost
            from celery.worker.state import reserved_requests

            from tasks.broker.app import redis_client

            kept = HELD_JOBS.keep_only({request.id for request in reserved_requests})
            dropped = give_back_all_but(redis_client(), kept)
            log.warning("consumer reconnected: %d job(s) received and not yet run were "
                        "dropped; their messages go back to their lanes", dropped)


HELD_JOBS = HeldJobs()
HOOKS: list[Hook] = [NoEviction(), OwnQueues(), WarmModels(), WorkerSetup(), JobStats(),
                     HELD_JOBS, KeepLeases(HELD_JOBS), HEALTH_HOOK, StatsPush(),
                     BoundedStop(HELD_JOBS.running)]


def install() -> None:
    """Wire every hook; called once, as the worker's task module loads."""
    for hook in HOOKS:
        hook.connect()
    from tasks.broker.app import app

    app.steps["consumer"].add(ConsumerRestarts)
