"""Worker concerns as small hook objects wired to Celery signals from one list.

Add a concern (VRAM guard, metrics, ...) by writing a hook and listing it in
``HOOKS``; nothing else in the worker changes.
"""
from __future__ import annotations

import logging
import threading
import time
from collections import defaultdict, deque
from functools import cached_property
from typing import Any, Callable

from celery import signals
from celery.utils.dispatch import Signal
from kombu.transport.redis import Channel as RedisChannel

import celeryconfig as cfg
from gpu_worker import control  # noqa: F401  registers the heartbeat command
from gpu_worker.devices import worker_device
from gpu_worker.runtime import RUNTIME
from routing.names import GENERATE_TASK, HOLDERS_KEY, LANES, lane_of, lease_key
from routing.store import connect

log = logging.getLogger(__name__)
#: Exit status of a worker whose models failed to load (EX_CONFIG).
EXIT_NOT_WARM = 78


class Hook:
    """Maps Celery signals to bound handlers; ``connect`` wires them."""

    def handlers(self) -> dict[Signal, Callable[..., Any]]:
        raise NotImplementedError

    def connect(self) -> None:
        for signal, handler in self.handlers().items():
            signal.connect(handler, weak=False)


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
    """Pin torch, then load and warm every model in GPULANES_WARM_MODELS.

    Runs in ``worker_init``: in the worker's main process, before the
    consumer starts, so no job is consumed until the models are warm.
    """

    def handlers(self) -> dict[Signal, Callable[..., Any]]:
        return {signals.worker_init: self.on_worker_init}

    def on_worker_init(self, sender: Any = None, **_: Any) -> None:
        import torch

        torch.set_num_threads(cfg.TORCH_THREADS)
        device = worker_device(cfg.DEVICE)
        RUNTIME.configure(sender.hostname, device, cfg.MODELS, cfg.MODEL_DIR, cfg.MODEL_SLOTS)
        try:
            for name in cfg.WARM_MODELS:
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
        self._began: dict[int, tuple[str, float]] = {}

    def handlers(self) -> dict[Signal, Callable[..., Any]]:
        return {signals.task_prerun: self.on_prerun, signals.task_postrun: self.on_postrun}

    def on_prerun(self, task: Any, **_: Any) -> None:
        if task.name == GENERATE_TASK:
            lane = lane_of(task.request.delivery_info.get("routing_key") or "unknown")
            self._began[threading.get_ident()] = (lane, time.perf_counter())
            RUNTIME.job_started(lane)

    def on_postrun(self, state: str | None = None, **_: Any) -> None:
        lane, began = self._began.pop(threading.get_ident(), (None, 0.0))
        if lane is not None:
            ok = state == "SUCCESS"
            RUNTIME.job_finished(lane, (time.perf_counter() - began) * 1000 if ok else None)


# KEYS: holders hash. ARGV: delivery tag, incarnation. Drop the entry if it is ours.
_RELEASE = """
if redis.call('HGET', KEYS[1], ARGV[1]) == ARGV[2] then redis.call('HDEL', KEYS[1], ARGV[1]) end
"""


class HeldJobs(Hook):
    """Record in Redis which worker incarnation holds each broker message.

    Redis has no acks: if this process dies, beat's health check finds its
    messages here and puts them back at once instead of after the visibility
    timeout. An entry goes when its job is done (the message is acked right
    after) and, on a clean shutdown, when kombu puts the message back itself.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._received: dict[str, deque[str]] = defaultdict(deque)
        self._running: dict[int, tuple[str, str]] = {}  # pool thread -> (tag, job id)

    @cached_property
    def _redis(self):
        return connect(cfg.broker_url, cfg.SENTINEL_MASTER)

    @cached_property
    def _release(self):
        return self._redis.register_script(_RELEASE)

    def handlers(self) -> dict[Signal, Callable[..., Any]]:
        return {signals.task_received: self.on_received, signals.task_prerun: self.on_prerun,
                signals.task_postrun: self.on_postrun, signals.worker_shutdown: self.on_shutdown}

    def on_received(self, request: Any = None, **_: Any) -> None:
        tag = request.message.delivery_tag
        with self._lock:  # a retry's message (same id) may arrive before the run ends
            self._received[request.id].append(tag)
        self._redis.hset(HOLDERS_KEY, tag, RUNTIME.incarnation)

    def on_prerun(self, task_id: str, **_: Any) -> None:
        with self._lock:
            tags = self._received.get(task_id)
            if tags:
                self._running[threading.get_ident()] = (tags.popleft(), task_id)
                if not tags:
                    del self._received[task_id]

    def on_postrun(self, **_: Any) -> None:
        with self._lock:
            tag, _ = self._running.pop(threading.get_ident(), (None, None))
        if tag is not None:
            self._release(keys=[HOLDERS_KEY], args=[tag, RUNTIME.incarnation])

    def held(self) -> tuple[list[str], list[str]]:
        """(delivery tags of every message this process holds, ids of the jobs it runs)."""
        with self._lock:
            waiting = [tag for tags in self._received.values() for tag in tags]
            running = list(self._running.values())
        return waiting + [tag for tag, _ in running], [job_id for _, job_id in running]

    def on_shutdown(self, **_: Any) -> None:
        ours = [tag for tag, who in self._redis.hgetall(HOLDERS_KEY).items()
                if who == RUNTIME.incarnation]
        for tag in ours:
            self._release(keys=[HOLDERS_KEY], args=[tag, RUNTIME.incarnation])


# KEYS: kombu's unacked index, then the lease of each running job. ARGV: now,
# incarnation, lease ttl, then the delivery tags. XX: an acked tag stays gone.
_KEEP = """
for i = 4, #ARGV do redis.call('ZADD', KEYS[1], 'XX', ARGV[1], ARGV[i]) end
for i = 2, #KEYS do
  if redis.call('GET', KEYS[i]) == ARGV[2] then redis.call('EXPIRE', KEYS[i], ARGV[3]) end
end
"""


class KeepHeld(Hook):
    """Keep Redis from handing out again a job this worker still holds.

    kombu redelivers an unacked message once its delivery is older than the
    visibility timeout, even while a live worker runs it. So, every
    ``cfg.KEEPALIVE_S``, this worker dates each message it holds from now (the
    score in kombu's unacked index) and extends the lease of each job it runs.
    A worker that dies stops: its jobs come back after the timeout, or at once
    through beat's health check.
    """

    def __init__(self, held: HeldJobs) -> None:
        self.held = held
        index = cfg.broker_transport_options.get("unacked_index_key")
        self.index_key = index or RedisChannel.unacked_index_key

    @cached_property
    def _keep(self):
        return connect(cfg.broker_url, cfg.SENTINEL_MASTER).register_script(_KEEP)

    def handlers(self) -> dict[Signal, Callable[..., Any]]:
        return {signals.worker_ready: self.on_ready}

    def on_ready(self, **_: Any) -> None:
        # Runs until the process ends: a warm shutdown still finishes its jobs.
        threading.Thread(target=self._loop, name="keep-held", daemon=True).start()

    def _loop(self) -> None:
        while True:
            time.sleep(cfg.KEEPALIVE_S)
            try:
                self.refresh()
            except Exception:  # noqa: BLE001  Redis away: try again next round
                log.warning("could not keep held jobs fresh", exc_info=True)

    def refresh(self) -> None:
        tags, running = self.held.held()
        if tags or running:
            self._keep(keys=[self.index_key, *map(lease_key, running)],
                       args=[time.time(), RUNTIME.incarnation, cfg.LEASE_TTL_S, *tags])


HELD_JOBS = HeldJobs()
HOOKS: list[Hook] = [OwnQueues(), WarmModels(), JobStats(), HELD_JOBS, KeepHeld(HELD_JOBS)]


def install() -> None:
    """Wire every hook; called once when the Celery app is built."""
    for hook in HOOKS:
        hook.connect()
