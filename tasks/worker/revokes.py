"""What a revoked job tells Flower and the worker's log.

Flower keeps each task's state from Celery's events (``celery.events.state.State``),
where a custom state such as ``PROGRESS`` (from ``task-progress``) outranks REVOKED:
a plain ``task-revoked`` after progress is merged as an event that happened before it,
and the task is shown running for good. The ``task-revoked`` events of gpulanes'
task therefore state the task's ``state`` themselves (merged, it is taken as the
event's field), and name the task: a job revoked while queued is discarded before any
event of it named it.
"""
from __future__ import annotations

import logging
from typing import Any

from celery import states
from celery.worker.request import Request

from tasks.worker.steps import StepGuard

log = logging.getLogger(__name__)


def revoked_fields(name: str) -> dict[str, Any]:
    """The fields a ``task-revoked`` event of task ``name`` carries beyond Celery's."""
    return {"name": name, "state": states.REVOKED}


class NamedRevokeRequest(Request):
    """Celery's request of a message, whose ``task-revoked`` event (a job revoked while
    queued, discarded as it arrives) names its task and its state."""

    def send_event(self, type: str, **fields: Any) -> None:
        if type == "task-revoked":
            fields = {**revoked_fields(self.name), **fields}
        super().send_event(type, **fields)


def tell_revoked(task: Any) -> None:
    """The ``task-revoked`` event of ``task``'s job, as Celery's worker sends it for a job
    it revokes itself (not terminated, not expired); advisory: never raises."""
    try:
        task.send_event("task-revoked", retry=False, terminated=False, signum=None,
                        expired=False, **revoked_fields(task.name))
    except Exception as exc:  # noqa: BLE001  an event is advisory
        log.info("job %s: revoked event not sent (%s)", task.request.id, exc)


def how_far(guard: StepGuard | None) -> str:
    """How far a revoked job ran: "before it ran", or "after 54 of 60 steps"."""
    if guard is None:
        return "before it ran"
    of = f" of {guard.steps}" if guard.steps is not None else ""
    return f"after {guard.step}{of} steps"
