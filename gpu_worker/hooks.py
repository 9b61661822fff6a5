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
from routing.names import GENERATE_TASK, INCARNATIONS_KEY, held_key
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
    """Count in-flight jobs and measure service time for the heartbeat."""

    def __init__(self) -> None:
        self._began: dict[str, tuple[str, float]] = {}

    def handlers(self) -> dict[Signal, Callable[..., Any]]:
        return {signals.task_prerun: self.on_prerun, signals.task_postrun: self.on_postrun}

    def on_prerun(self, task_id: str, task: Any, **_: Any) -> None:
        if task.name == GENERATE_TASK:
            lane = task.request.delivery_info.get("routing_key") or "unknown"
            self._began[task_id] = (lane, time.perf_counter())
            RUNTIME.job_started(lane)

    def on_postrun(self, task_id: str, task: Any, state: str | None = None, **_: Any) -> None:
        lane, began = self._began.pop(task_id, (None, 0.0))
        if lane is not None:
            ok = state == "SUCCESS"
            RUNTIME.job_finished(lane, (time.perf_counter() - began) * 1000 if ok else None)


class HeldJobs(Hook):
    """Record in Redis which broker messages this worker incarnation holds.

    Redis has no acks: if this process dies, beat's health check reads the
    record and puts these messages back at once instead of after the
    visibility timeout. Entries go when the job is done; a message is
    acked right after, so at worst a finished job is offered again and
    answered from its stored result.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._received: dict[str, deque[str]] = defaultdict(deque)
        self._running: dict[str, str] = {}

    @cached_property
    def _redis(self):
        return connect(cfg.broker_url)

    def handlers(self) -> dict[Signal, Callable[..., Any]]:
        return {signals.task_received: self.on_received,
                signals.task_prerun: self.on_prerun, signals.task_postrun: self.on_postrun}

    def on_received(self, request: Any = None, **_: Any) -> None:
        tag = request.message.delivery_tag
        with self._lock:  # a retry's message (same id) may arrive before the run ends
            self._received[request.id].append(tag)
        with self._redis.pipeline(transaction=False) as pipe:
            pipe.hset(INCARNATIONS_KEY, RUNTIME.incarnation, RUNTIME.started_at)
            pipe.hset(held_key(RUNTIME.incarnation), tag, request.id).execute()

    def on_prerun(self, task_id: str, **_: Any) -> None:
        with self._lock:
            tags = self._received.get(task_id)
            if tags:
                self._running[task_id] = tags.popleft()
                if not tags:
                    del self._received[task_id]

    def on_postrun(self, task_id: str, **_: Any) -> None:
        with self._lock:
            tag = self._running.pop(task_id, None)
        if tag is not None:
            self._redis.hdel(held_key(RUNTIME.incarnation), tag)


HOOKS: list[Hook] = [WarmModels(), JobStats(), HeldJobs()]


def install() -> None:
    """Wire every hook; called once when the Celery app is built."""
    for hook in HOOKS:
        hook.connect()
