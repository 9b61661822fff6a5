"""``GET /v1/predictions/{id}/events``: a prediction's events as Server-Sent Events.

Each event of its log (``tasks.jobs.events``) goes out with its id: ``queued`` (its
lane and place), ``started``, ``progress``, ``output`` (a success's) and ``completed``
(the whole prediction, as ``GET`` shows it), after which the stream ends. A client that
reconnects with ``Last-Event-ID`` gets the events after that one, each once, from any
API process. While the job waits, its place is sent again (a ``queued`` event with no
id) when it changes.

One :class:`Hub` per process wakes the streams: it subscribes to the channel of each
log being read, and a new event wakes that log's readers at once. A stream that hears
nothing looks again every :data:`IDLE_S`: at its place, its ``Cancel-After``, and at a
job whose end its log lacks.
"""
from __future__ import annotations

import asyncio
import json
import logging
import queue
import threading
from typing import Any, AsyncIterator, NamedTuple

import redis
from fastapi import APIRouter, Depends, Header, Request
from sse_starlette import EventSourceResponse
from starlette.concurrency import run_in_threadpool

from tasks.broker.app import app as celery_app
from tasks.broker.app import redis_client
from tasks.broker.keys import events_key
from tasks.broker.outage import OUTAGE
from tasks.front.auth import caller
from tasks.front.errors import Refused, iso
from tasks.front.predictions import base_url, owned
from tasks.front.views import FINAL, PROGRESS_FIELDS, finished, prediction_json, seen, status
from tasks.jobs import events, predictions
from tasks.jobs.apikeys import ApiKey
from tasks.jobs.events import Event
from tasks.jobs.predictions import Prediction

log = logging.getLogger(__name__)
router = APIRouter(prefix="/v1", tags=["predictions"])
#: Seconds a stream that heard nothing waits before it looks again itself.
IDLE_S = 2.0
#: Seconds between two comments that keep an idle connection open through proxies.
PING_S = 15
#: Seconds the hub's thread waits for a message before it looks at its requests.
LISTEN_S = 0.05
#: Seconds a stream waits for its subscription before it reads its log anyway.
SUBSCRIBE_WAIT_S = 2.0


class Hub:
    """This process's subscriptions to the logs its streams read. A thread owns the
    subscriber connection (it listens, and subscribes and unsubscribes as streams ask);
    each message sets the :class:`asyncio.Event` of every stream reading that log."""

    def __init__(self, client: redis.Redis, loop: asyncio.AbstractEventLoop) -> None:
        self.client, self.loop = client, loop
        self.readers: dict[str, set[asyncio.Event]] = {}
        self.asked: queue.SimpleQueue[tuple[str, str, asyncio.Future | None]] = \
            queue.SimpleQueue()
        self.stopped = threading.Event()
        self.thread = threading.Thread(target=self._listen, name="event-hub", daemon=True)
        self.thread.start()

    async def watch(self, channel: str) -> asyncio.Event:
        """An event set whenever ``channel``'s log grows, once the hub listens there (or
        after :data:`SUBSCRIBE_WAIT_S`: the stream reads its log itself meanwhile)."""
        woken = asyncio.Event()
        readers = self.readers.setdefault(channel, set())
        readers.add(woken)
        if len(readers) == 1:
            subscribed = self.loop.create_future()
            self.asked.put(("subscribe", channel, subscribed))
            try:
                await asyncio.wait_for(asyncio.shield(subscribed), SUBSCRIBE_WAIT_S)
            except asyncio.TimeoutError:
                pass
        return woken

    def unwatch(self, channel: str, woken: asyncio.Event) -> None:
        readers = self.readers.get(channel)
        if readers is None:
            return
        readers.discard(woken)
        if not readers:
            del self.readers[channel]
            self.asked.put(("unsubscribe", channel, None))

    def close(self) -> None:
        self.stopped.set()
        self.thread.join(timeout=5)

    def _wake(self, channel: str | None) -> None:
        """Wake the readers of ``channel`` (None: every reader, after a lost connection)."""
        chosen = self.readers.values() if channel is None else [self.readers.get(channel, ())]
        for readers in chosen:
            for woken in readers:
                woken.set()

    def _listen(self) -> None:
        pubsub = self.client.pubsub()
        waiting: dict[str, list[asyncio.Future]] = {}
        while not self.stopped.is_set():
            try:
                while not self.asked.empty():
                    verb, channel, done = self.asked.get_nowait()
                    getattr(pubsub, verb)(channel)
                    if done is not None:
                        waiting.setdefault(channel, []).append(done)
                message = pubsub.get_message(timeout=LISTEN_S) if pubsub.subscribed \
                    else self.stopped.wait(LISTEN_S)
            except OUTAGE as exc:
                log.info("event hub: Redis away (%s); listening again", exc)
                self.loop.call_soon_threadsafe(self._wake, None)
                pubsub.close()  # resubscribed below, from what the streams read
                pubsub = self.client.pubsub()
                for channel in list(self.readers):
                    self.asked.put(("subscribe", channel, None))
                self.stopped.wait(0.5)
                continue
            if not isinstance(message, dict):
                continue
            channel = _text(message.get("channel"))
            if message.get("type") == "message":
                self.loop.call_soon_threadsafe(self._wake, channel)
            elif message.get("type") == "subscribe":
                for done in waiting.pop(channel, []):
                    self.loop.call_soon_threadsafe(_resolve, done)
        pubsub.close()


def _resolve(done: asyncio.Future) -> None:
    if not done.done():
        done.set_result(None)


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


_hubs: dict[int, Hub] = {}


def hub() -> Hub:
    """This event loop's hub, made on first use."""
    loop = asyncio.get_running_loop()
    found = _hubs.get(id(loop))
    if found is None or found.loop is not loop:
        found = _hubs[id(loop)] = Hub(redis_client(), loop)
    return found


def close_hubs() -> None:
    while _hubs:
        _hubs.popitem()[1].close()


class Read(NamedTuple):
    """What one look at a prediction found: the events to send, the last logged one's
    id, whether its log ended, and whether to read again at once."""

    sent: list[dict[str, Any]]
    last: str | None
    ended: bool = False
    again: bool = False
    #: the prediction's record read again (a parked job may have entered its lane)
    prediction: Prediction | None = None


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
    channel, the_hub = events_key(prediction.id), hub()
    woken = await the_hub.watch(channel)
    look, place = True, None
    try:
        while True:
            woken.clear()
            try:
                found = await run_in_threadpool(_read, prediction, last, base, look)
            except OUTAGE as exc:  # Redis away: the stream waits for it, as a caller would
                log.info("events of %s: Redis away (%s)", prediction.id, exc)
                found = Read([], last)
            for item in found.sent:
                if "id" not in item:  # its place now: sent when it changed
                    if item["data"] == place:
                        continue
                    place = item["data"]
                yield item
            last, prediction = found.last, found.prediction or prediction
            if found.ended:
                return
            if found.again:
                continue
            try:
                await asyncio.wait_for(woken.wait(), IDLE_S)
                look = False
            except asyncio.TimeoutError:
                look = True
    finally:
        the_hub.unwatch(channel, woken)


def _read(prediction: Prediction, last: str | None, base: str, look: bool) -> Read:
    """The events logged after ``last``; when none and ``look``, the job itself: its
    place while it waits, or an end its log lacks, logged now (blocks on Redis)."""
    client = redis_client()
    logged = events.after(client, prediction.id, last)
    if logged:
        sent = []
        for event in logged:
            sent.append(_shown(event, prediction, base, client, last=event is logged[-1]))
            if event.kind == "completed":
                return Read(sent, event.id, ended=True)
        return Read(sent, logged[-1].id, again=len(logged) >= events.PAGE)
    if not look:
        return Read([], last)
    found = seen(celery_app, client, prediction, placed=False)
    now = status(prediction, found)
    if now in FINAL:  # ended with no end logged: a cancel while it waited, a state
        ended = found.state if found.state != "PENDING" else "REVOKED"  # stored apart
        return Read([], last, again=events.end(client, prediction.id, ended,
                                               unless_began=found.state == "PENDING"))
    if now != "starting":
        return Read([], last)
    prediction = predictions.owned(client, prediction.account, prediction.id) or prediction
    where = predictions.position(client, prediction)
    return Read([] if where is None else [_place(prediction, where)], last,
                prediction=prediction)


def _shown(event: Event, prediction: Prediction, base: str, client: redis.Redis,
           last: bool) -> dict[str, Any]:
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
