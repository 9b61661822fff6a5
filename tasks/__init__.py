"""gpulanes public API: ``from tasks import submit`` (and ``result``: a job's
``AsyncResult`` by its id, on its cell's Redis); ``celery -A tasks`` finds ``app``.

Attributes load lazily so that leaf modules (``tasks.errors``) import without
building the Celery app.
"""
from __future__ import annotations

from typing import Any

__all__ = ["app", "result", "submit"]


def __getattr__(name: str) -> Any:
    if name == "app":
        from tasks.broker.app import app
        from tasks.flower_login import refuse_open_flower

        refuse_open_flower()  # `celery -A tasks flower` loads the app here
        return app
    if name == "submit":
        from tasks.api import submit
        return submit
    if name == "result":
        from tasks.broker.cells import result
        return result
    raise AttributeError(f"module 'tasks' has no attribute {name!r}")
