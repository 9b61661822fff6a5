"""A prediction's events: what happened to it, in order, kept beside its record.

Each is logged in the same Redis step as the change it tells (``lua/events.lua``):
``queued`` by the publish, ``started`` by the run's begin, ``progress`` with each
progress report, ``output`` then ``completed`` by the run's finish (``completed`` alone
for a failure or a cancel). Nothing follows ``completed``, and ``started`` is logged
once (a preempted run that resumes does not start the prediction again).

The log is a Redis stream: an event's id is its stream id, so a reader that says the
last id it saw (``Last-Event-ID``) gets every later event once, whichever process
serves it. It keeps about the last 1,024 events, as long as the record, and each new
one is announced on a channel of the log's own name, to wake readers.

A prediction with a webhook has the events its filter takes put in the webhook outbox
(``tasks.front.hooks`` sends them), progress at most every :data:`PROGRESS_GAP_MS`.
"""
from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any, Iterable

import redis
from kombu.utils.encoding import bytes_to_str

from tasks.broker import scripts
from tasks.broker.keys import WEBHOOKS_DUE_KEY, events_key, prediction_key

#: The kinds of event, in the order a prediction that succeeds has them.
KINDS = ("queued", "started", "progress", "output", "completed")
#: What a webhook's ``webhook_events_filter`` names (Replicate's words), by the kind of
#: event each one takes.
WEBHOOK_EVENTS = {"start": "started", "progress": "progress", "output": "output",
                  "completed": "completed"}
#: Least time between two progress events a webhook is sent (ms).
PROGRESS_GAP_MS = 500
#: Most events read at once.
PAGE = 100
#: An event id: a stream id, "<ms>-<sequence>".
EVENT_ID = re.compile(r"\d{1,20}-\d{1,20}")


@dataclass(frozen=True)
class Event:
    """One logged event: its id (the stream's), kind and data."""

    id: str
    kind: str
    data: dict[str, Any]

    @property
    def at(self) -> float:
        """When it was logged (unix s): its id's milliseconds."""
        return int(self.id.split("-", 1)[0]) / 1000


def hook(events: Iterable[str]) -> str:
    """What the publish writes into the record of a prediction whose webhook takes
    ``events`` (names of :data:`WEBHOOK_EVENTS`): "outbox kinds gap_ms"."""
    kinds = ",".join(WEBHOOK_EVENTS[name] for name in events)
    return f"{WEBHOOKS_DUE_KEY} {kinds} {PROGRESS_GAP_MS}"


def after(client: redis.Redis, job_id: str, last_id: str | None = None,
          count: int = PAGE) -> list[Event]:
    """Up to ``count`` of the prediction's events after ``last_id`` (None: from the
    first kept), oldest first."""
    low = f"({last_id}" if last_id else "-"
    return [_event(entry_id, fields)
            for entry_id, fields in client.xrange(events_key(job_id), low, "+", count)]


def valid_id(text: str | None) -> bool:
    """Whether ``text`` is an event id (one a reader may resume after)."""
    return bool(text) and EVENT_ID.fullmatch(text) is not None


def end(client: redis.Redis, job_id: str, state: str, unless_began: bool) -> bool:
    """Log the prediction's ``completed`` event with Celery's ``state`` where its job's
    own end was not logged (``unless_began``: only if its job never began, as for a
    cancel while it waits); whether it was logged now."""
    return bool(scripts.run(client, "event_end", [prediction_key(job_id)],
                            [json.dumps({"state": state}), "1" if unless_began else ""]))


def _event(entry_id: Any, fields: dict[Any, Any]) -> Event:
    text = {bytes_to_str(k): bytes_to_str(v) for k, v in fields.items()}
    try:
        data = json.loads(text.get("data") or "{}")
    except ValueError:
        data = {}
    return Event(bytes_to_str(entry_id), text.get("kind", ""), data if isinstance(data, dict) else {})
