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

import celeryconfig as cfg
from gpu_worker import control  # noqa: F401  registers the heartbeat command
from gpu_worker.devices import worker_device
from gpu_worker.runtime import RUNTIME
from routing.names import GENERATE_TASK, HOLDERS_KEY, LANES, lane_of
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
        self._running: dict[int, str] = {}

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
                self._running[threading.get_ident()] = tags.popleft()
                if not tags:
                    del self._received[task_id]

    def on_postrun(self, **_: Any) -> None:
        with self._lock:
            tag = self._running.pop(threading.get_ident(), None)
        if tag is not None:
            self._release(keys=[HOLDERS_KEY], args=[tag, RUNTIME.incarnation])

    def on_shutdown(self, **_: Any) -> None:
        ours = [tag for tag, who in self._redis.hgetall(HOLDERS_KEY).items()
                if who == RUNTIME.incarnation]
        for tag in ours:
            self._release(keys=[HOLDERS_KEY], args=[tag, RUNTIME.incarnation])


HOOKS: list[Hook] = [OwnQueues(), WarmModels(), JobStats(), HeldJobs()]


def install() -> None:
    """Wire every hook; called once when the Celery app is built."""
    for hook in HOOKS:
        hook.connect()
