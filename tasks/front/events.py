"""``GET /v1/predictions/{id}/events``: a prediction's events as Server-Sent Events.

Each event of its log (``tasks.jobs.events``) goes out with its id: ``queued`` (its
lane and place), ``started``, ``progress``, ``output`` (a success's) and ``completed``
(the whole prediction, as ``GET`` shows it), after which the stream ends. A client that
reconnects with ``Last-Event-ID`` gets the events after that one, each once, from any
API process. While the job waits, its place is sent again (a ``queued`` event with no
id) when it changes.

A stream reads its log when a new event is announced, and hears of its job's place,
or of an end its log lacks, from its process's hub (``tasks.front.hub``): idle, it
costs no read of its own.
"""
from __future__ import annotations

import json
import logging
from typing import Any, AsyncIterator, NamedTuple

import redis
from fastapi import APIRouter, Depends, Header, Request
from sse_starlette import EventSourceResponse
from starlette.concurrency import run_in_threadpool

from tasks.broker.cells import of_job
from tasks.broker.outage import OUTAGE
from tasks.front.auth import caller
from tasks.front.errors import Refused, iso
from tasks.front.hub import hub
from tasks.front.predictions import base_url, owned
from tasks.front.views import FINAL, PROGRESS_FIELDS, finished, prediction_json, seen, status
from tasks.jobs import events, predictions
from tasks.jobs.apikeys import ApiKey
from tasks.jobs.events import Event
from tasks.jobs.predictions import Prediction

log = logging.getLogger(__name__)
router = APIRouter(prefix="/v1", tags=["predictions"])
#: Seconds between two comments that keep an idle connection open through proxies.
PING_S = 15


class Read(NamedTuple):
    """What one read of a prediction's log found: the events to send, the last one's
    id, whether the log ended, and whether more are to be read at once."""

    sent: list[dict[str, Any]]
    last: str | None
    ended: bool = False
    again: bool = False


@router.get("/predictions/{prediction_id}/events", response_class=EventSourceResponse,
            responses={200: {"content": {"text/event-stream": {}}, "description": (
                "queued, started, progress, output and completed events; each logged "
                "one has an id to resume after (`Last-Event-ID`).")}})
async def prediction_events(prediction_id: str, request: Request,
                            key: ApiKey = Depends(caller),
                            last_event_id: str | None = Header(None)) -> EventSourceResponse:
    """The prediction's events as they happen (Server-Sent Events), from after
    ``Last-Event-ID`` if given; the stream ends after ``completed``."""
    if last_event_id is not None and not events.valid_id(last_event_id):
        raise Refused(422, "Last-Event-ID: must be an event id this stream sent, such as "
                      f"1733300000000-0, got {last_event_id[:60]!r}", "Last-Event-ID")
    prediction = await run_in_threadpool(owned, key.account, prediction_id)
    return EventSourceResponse(_stream(prediction, last_event_id, base_url(request)),
                               ping=PING_S)


async def _stream(prediction: Prediction, last: str | None, base: str
                  ) -> AsyncIterator[dict[str, Any]]:
    """The events of ``prediction`` after ``last``, until its log ends."""
    the_hub = hub(prediction.id)
    watch = await the_hub.watch(prediction)
    place, looked = None, None
    try:
        while True:
            watch.woken.clear()
            if watch.logged:
                watch.logged = False
                try:
                    found = await run_in_threadpool(_read, prediction, last, base)
                except OUTAGE as exc:  # Redis away: the stream waits for it
                    log.info("events of %s: Redis away (%s)", prediction.id, exc)
                    found = Read([], last)
                for item in found.sent:
                    yield item
                last = found.last
                if found.ended:
                    return
                if found.again:
                    watch.logged = True
                    continue
            if watch.look is not None and watch.look is not looked:
                looked = watch.look
                now, seen_now = looked
                said = status(now, seen_now)
                if said in FINAL:  # ended, its end not logged: a cancel while it waited
                    state = seen_now.state if seen_now.state != "PENDING" else "REVOKED"
                    await run_in_threadpool(events.end, the_hub.client, prediction.id,
                                            state, seen_now.state == "PENDING")
                    watch.logged = True
                    continue
                if said == "starting" and seen_now.position is not None and \
                        seen_now.position != place:
                    place = seen_now.position
                    yield _place(now, place)
            await watch.woken.wait()
    finally:
        the_hub.unwatch(watch)


def _read(prediction: Prediction, last: str | None, base: str) -> Read:
    """The events logged after ``last``, as they are sent (blocks on Redis)."""
    celery_app, client = of_job(prediction.id)
    logged = events.after(client, prediction.id, last)
    sent = []
    for event in logged:
        sent.append(_shown(event, prediction, base, celery_app, client,
                           last=event is logged[-1]))
        if event.kind == "completed":
            return Read(sent, event.id, ended=True)
    return Read(sent, logged[-1].id if logged else last, again=len(logged) >= events.PAGE)


def _shown(event: Event, prediction: Prediction, base: str, celery_app: Any,
           client: redis.Redis, last: bool) -> dict[str, Any]:
    """``event`` as it is sent (``last``: the latest logged, so a queued one says its
    place now)."""
    if event.kind == "queued":
        where = predictions.position(client, prediction) if last else None
        data: dict[str, Any] = _queue(event.data.get("lane") or prediction.tier, where,
                                      bool(event.data.get("parked")))
    elif event.kind == "started":
        data = {"status": "processing", "started_at": iso(event.at)}
    elif event.kind == "progress":
        data = {"status": "processing",
                "progress": {k: event.data.get(k) for k in PROGRESS_FIELDS}}
        if event.data.get("paused"):
            data["progress"]["paused"] = True
    elif event.kind == "output":
        found = seen(celery_app, client, prediction, placed=False)
        made = finished(found.value, f"{base}/v1/predictions/{prediction.id}/files") \
            if found.state == "SUCCESS" and isinstance(found.value, dict) else {}
        data = {"output": made.get("output")}
    else:  # completed: the whole prediction
        data = prediction_json(prediction, seen(celery_app, client, prediction, False), base)
    return {"event": event.kind, "id": event.id, "data": json.dumps(data)}


def _place(prediction: Prediction, position: int) -> dict[str, Any]:
    """A queued event with no id: the prediction's place now."""
    return {"event": "queued",
            "data": json.dumps(_queue(prediction.lane or prediction.tier, position,
                                      prediction.parked))}


def _queue(lane: str, position: int | None, parked: bool) -> dict[str, Any]:
    return {"status": "starting", "queue": {"lane": lane, "position": position,
                                            "parked": parked}}
