"""A job message addressed as gpulanes' publishers address theirs, for tests that call
the broker's publish (``tasks.broker.publish``) directly."""
from __future__ import annotations

import time
from typing import Any

from routing.names import JOB_TASK
from tasks.broker.app import app
from tasks.broker.enqueue import addressed
from tasks.broker.publish import Message, envelope_of


def job_message(job_id: str, queue: str = "standard", kwargs: dict[str, Any] | None = None,
                entered_at: float | None = None) -> Message:
    """A call of the job task under ``job_id``, published to lane exchange ``queue``."""
    kwargs = kwargs if kwargs is not None else {"job": {}, "route": {}, "submitted_at": 0.0}
    sent = envelope_of(app, job_id, JOB_TASK, kwargs, queue)
    return addressed(queue, sent, time.time() if entered_at is None else entered_at)
