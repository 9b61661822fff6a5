"""Worker concerns as small hook objects wired to Celery signals from one list.

Add a concern (VRAM guard, metrics, ...) by writing a hook and listing it in
``HOOKS``; nothing else in the worker changes.
"""
from __future__ import annotations

import logging
import time
from typing import Any, Callable

from celery import signals
from celery.utils.dispatch import Signal

import celeryconfig as cfg
from gpu_worker import control  # noqa: F401  registers the heartbeat command
from gpu_worker.devices import worker_device
from gpu_worker.runtime import RUNTIME
from routing.names import GENERATE_TASK

log = logging.getLogger(__name__)


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

    def on_worker_init(self, **_: Any) -> None:
        import torch

        torch.set_num_threads(cfg.TORCH_THREADS)
        device = worker_device(cfg.DEVICE)
        RUNTIME.configure(device, cfg.MODELS, cfg.MODEL_DIR)
        for name in cfg.WARM_MODELS:
            RUNTIME.model(name)


class JobStats(Hook):
    """Count in-flight jobs and measure service time for the heartbeat."""

    def __init__(self) -> None:
        self._began: dict[str, float] = {}

    def handlers(self) -> dict[Signal, Callable[..., Any]]:
        return {signals.task_prerun: self.on_prerun, signals.task_postrun: self.on_postrun}

    def on_prerun(self, task_id: str, task: Any, **_: Any) -> None:
        if task.name == GENERATE_TASK:
            self._began[task_id] = time.perf_counter()
            RUNTIME.job_started()

    def on_postrun(self, task_id: str, task: Any, state: str | None = None, **_: Any) -> None:
        began = self._began.pop(task_id, None)
        if began is None:
            return
        ok = state == "SUCCESS"
        RUNTIME.job_finished((time.perf_counter() - began) * 1000 if ok else None)


HOOKS: list[Hook] = [WarmModels(), JobStats()]


def install() -> None:
    """Wire every hook; called once when the Celery app is built."""
    for hook in HOOKS:
        hook.connect()
