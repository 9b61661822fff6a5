"""One :class:`Hub` per API process wakes its event streams (``tasks.front.events``).

- **New events.** A thread owns one subscriber connection: it subscribes to the channel
  of each log a stream reads (``tasks.jobs.events``), and each message there wakes
  that log's streams at once. A lost connection wakes every stream, to read its log
  again, and subscribes again.
- **What no event says.** Every :data:`LOOK_S` the hub looks at all its streams'
  predictions in a few round trips (``tasks.front.views.seen_many``) and wakes a stream
  whose look changed: a waiting job's place, a cancel or ``Cancel-After`` that ended it
  while it waited, an end its log lacks. A thousand idle streams cost three pipelined
  reads per look, not a read each.
"""
from __future__ import annotations

import asyncio
import logging
import queue
import threading
from dataclasses import dataclass, field
from typing import Any

import redis
from kombu.utils.encoding import bytes_to_str
from starlette.concurrency import run_in_threadpool

from tasks.broker.cell import named_by
from tasks.broker.cells import of_job
from tasks.broker.keys import events_key
from tasks.broker.outage import OUTAGE
from tasks.front.views import Seen, seen_many
from tasks.jobs.predictions import Prediction

log = logging.getLogger(__name__)
#: Seconds between two looks at every stream's prediction.
LOOK_S = 5.0
#: Seconds the hub's thread waits for a message before it looks at its requests.
LISTEN_S = 0.05
#: Seconds a stream waits for its subscription before it reads its log anyway.
SUBSCRIBE_WAIT_S = 2.0


@dataclass(eq=False)
class Watch:
    """One stream's part in the hub: its prediction, what woke it, the latest look."""

    prediction: Prediction
    woken: asyncio.Event = field(default_factory=asyncio.Event)
    #: its log grew (or may have: the subscription was lost) since the stream read it
    logged: bool = True
    #: the hub's latest look at its prediction, when one changed
    look: tuple[Prediction, Seen] | None = None

    @property
    def channel(self) -> str:
        return events_key(self.prediction.id)


class Hub:
    """This process's subscriptions and looks, for the streams of one event loop (and,
    with cells, of one cell: its Redis, ``client``, and its Celery app's results)."""

    def __init__(self, client: redis.Redis, loop: asyncio.AbstractEventLoop,
                 celery_app: Any) -> None:
        self.client, self.loop, self.celery_app = client, loop, celery_app
        self.readers: dict[str, set[Watch]] = {}
        self.asked: queue.SimpleQueue[tuple[str, str, asyncio.Future | None]] = \
            queue.SimpleQueue()
        self.stopped = threading.Event()
        self.thread = threading.Thread(target=self._listen, name="event-hub", daemon=True)
        self.thread.start()
        self.looking = loop.create_task(self._looking())

    async def watch(self, prediction: Prediction) -> Watch:
        """A watch of ``prediction``'s log, once the hub listens there (or after
        :data:`SUBSCRIBE_WAIT_S`: the stream reads its log itself meanwhile)."""
        watch = Watch(prediction)
        readers = self.readers.setdefault(watch.channel, set())
        readers.add(watch)
        if len(readers) == 1:
            subscribed = self.loop.create_future()
            self.asked.put(("subscribe", watch.channel, subscribed))
            try:
                await asyncio.wait_for(asyncio.shield(subscribed), SUBSCRIBE_WAIT_S)
            except asyncio.TimeoutError:
                pass
        return watch

    def unwatch(self, watch: Watch) -> None:
        readers = self.readers.get(watch.channel)
        if readers is None:
            return
        readers.discard(watch)
        if not readers:
            del self.readers[watch.channel]
            self.asked.put(("unsubscribe", watch.channel, None))

    def close(self) -> None:
        self.looking.cancel()
        self.stopped.set()
        self.thread.join(timeout=5)

    def _logged(self, channel: str | None) -> None:
        """Wake the streams of ``channel``'s log (None: every stream's)."""
        chosen = self.readers.values() if channel is None else [self.readers.get(channel, ())]
        for watches in chosen:
            for watch in watches:
                watch.logged = True
                watch.woken.set()

    async def _looking(self) -> None:
        while True:
            await asyncio.sleep(LOOK_S)
            watches = [watch for found in self.readers.values() for watch in found]
            if not watches:
                continue
            try:
                looks = await run_in_threadpool(seen_many, self.celery_app, self.client,
                                                [watch.prediction for watch in watches])
            except OUTAGE as exc:
                log.info("event hub: Redis away (%s)", exc)
                continue
            for watch, look in zip(watches, looks):
                if watch.look is None or watch.look[1] != look[1]:
                    watch.look = look
                    watch.woken.set()

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
                self.loop.call_soon_threadsafe(self._logged, None)
                pubsub.close()  # subscribed again below, to what the streams read
                pubsub = self.client.pubsub()
                for channel in list(self.readers):
                    self.asked.put(("subscribe", channel, None))
                self.stopped.wait(0.5)
                continue
            if not isinstance(message, dict):
                continue
            channel = bytes_to_str(message.get("channel"))
            if message.get("type") == "message":
                self.loop.call_soon_threadsafe(self._logged, channel)
            elif message.get("type") == "subscribe":
                for done in waiting.pop(channel, []):
                    self.loop.call_soon_threadsafe(_resolve, done)
        pubsub.close()


def _resolve(done: asyncio.Future) -> None:
    if not done.done():
        done.set_result(None)


_hubs: dict[tuple[int, str | None], Hub] = {}


def hub(job_id: str) -> Hub:
    """The hub of this event loop for the cell ``job_id`` names, made on first use."""
    loop = asyncio.get_running_loop()
    where = (id(loop), named_by(job_id))
    found = _hubs.get(where)
    if found is None or found.loop is not loop:
        celery_app, client = of_job(job_id)
        found = _hubs[where] = Hub(client, loop, celery_app)
    return found


def close_hubs() -> None:
    while _hubs:
        _hubs.popitem()[1].close()
