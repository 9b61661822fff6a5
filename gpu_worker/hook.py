"""The base of worker hooks: a concern wired to Celery signals (``gpu_worker.hooks``)."""
from __future__ import annotations

from typing import Any, Callable

from celery.utils.dispatch import Signal


class Hook:
    """Maps Celery signals to bound handlers; ``connect`` wires them."""

    def handlers(self) -> dict[Signal, Callable[..., Any]]:
        raise NotImplementedError

    def connect(self) -> None:
        for signal, handler in self.handlers().items():
            signal.connect(handler, weak=False)
