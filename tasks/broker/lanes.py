"""gpulanes' kombu transport: Redis lists, taken through the queue protocol's hand-over.

A kombu virtual transport (``kombu.transport.virtual``), built on the methods kombu
asks of one and nothing private of kombu's Redis transport or of Celery. It is
registered as ``gpulanes`` and chosen by a broker URL that names it:
``gpulanes+redis://host:6379/0``, ``gpulanes+redis+socket:///path``,
``gpulanes+sentinel://host:26379`` (with the ``master_name`` transport option).

- Queues are Redis lists, one per priority level (``keys.list_key``); a consumer takes
  with ``tasks.broker.handover.take``: the next message of the first list, in the order
  the queues were consumed, recorded as this process's in the same step.
- An ack drops the record; a reject with requeue, or a channel closed with messages
  unacked, gives each back to the front of its list in the step that drops its record.
- Nothing polls: a push publishes a wake-up on its queue's channel, and the
  transport waits on one pub/sub connection, subscribed to the queues it consumes and
  to the fanout exchanges they are bound to (Celery's remote control and events).
- Bindings of direct and topic exchanges are kept in Redis, for every process.
"""
from __future__ import annotations

import logging
import os
import queue
import socket
import threading
import time
import uuid
from bisect import bisect
from collections import deque
from typing import Any, Iterable

import kombu.transport
import redis
from kombu.transport import virtual
from kombu.utils.json import dumps, loads

from tasks.broker import handover
from tasks.broker.holder import holder as worker_holder
from tasks.broker.keys import (
    BINDINGS_PREFIX,
    FANOUT_PREFIX,
    PRIORITY_SEP,
    WAKE_PREFIX,
    list_key,
)
from tasks.broker.moves import lane_clock_of
from tasks.broker.outage import OUTAGE
from tasks.broker.store import connect

log = logging.getLogger(__name__)
#: Priority levels of a queue's lists, unless ``priority_steps`` says otherwise (kombu's).
PRIORITY_STEPS = (0, 3, 6, 9)
#: Seconds an idle consumer waits on its wake-ups before it takes once anyway: a
#: safety net for a wake-up missed while its connection was down, not a poll.
IDLE_TAKE_S = 30.0
#: This process, as holder of what it takes, unless a worker names itself
#: (``tasks.broker.holder``).
_PROCESS = f"{socket.gethostname()}/{os.getpid()}/{time.time():.3f}"


def process_holder() -> str:
    """The holder this process's takes are recorded under."""
    return worker_holder() or _PROCESS


class Pending:
    """What this process owes Redis, settled before its next take: the token of a take
    whose answer was lost (repeated), acks and give-backs Redis did not answer. A
    process never keeps a record of a message it does not hold."""

    def __init__(self) -> None:
        self.unanswered = ""
        self.acks: set[str] = set()
        self.returns: dict[str, float] = {}  # token -> its job's lane clock
        self.registered: set[str] = set()

    def settle(self, client: redis.Redis, holder: str, record: bool) -> None:
        if record and holder not in self.registered:
            handover.register(client, holder)
            self.registered.add(holder)
        if self.acks:  # swapped first: pool threads add to it while this runs
            acks, self.acks = self.acks, set()
            try:
                handover.ack(client, holder, *acks)
            except OUTAGE:
                self.acks |= acks
                raise
        for token, entered_at in list(self.returns.items()):
            handover.give_back(client, holder, token, entered_at=entered_at)
            del self.returns[token]


PENDING = Pending()


class QoS(virtual.QoS):
    """kombu's prefetch accounting; an ack or a reject also settles the message's record."""

    def ack(self, delivery_tag: str) -> None:
        self.channel.settle(delivery_tag)
        super().ack(delivery_tag)
        self.channel.connection.room_made()

    def reject(self, delivery_tag: str, requeue: bool = False) -> None:
        if not requeue:  # with requeue, kombu gives it back (``Channel._restore``)
            self.channel.settle(delivery_tag)
        super().reject(delivery_tag, requeue)
        self.channel.connection.room_made()


class Channel(virtual.Channel):
    QoS = QoS
    supports_fanout = True
    from_transport_options = (*virtual.Channel.from_transport_options, "priority_steps")
    priority_steps = PRIORITY_STEPS

    def __init__(self, connection: Any, **kwargs: Any) -> None:
        super().__init__(connection, **kwargs)
        self.client: redis.Redis = connection.commands
        self.consuming: dict[str, tuple[str, bool]] = {}  # consumer tag -> (queue, no_ack)
        self.fanout_of: dict[str, str] = {}  # queue -> the fanout exchange it is bound to
        self.tokens: dict[str, str] = {}  # delivery tag -> take token (its record)
        self.inbox: deque[tuple[dict, str]] = deque()  # fanout messages to deliver
        self.ready, self.took_at = True, 0.0

    # -- the interface kombu asks of a virtual channel ----------------------------------
    def _put(self, queue: str, message: dict, **kwargs: Any) -> None:
        handover.push(self.client, self.list_of(queue, message), dumps(message))

    def _get(self, queue: str, timeout: float | None = None) -> dict:
        got = self.take([queue], record=True)
        if got is None:
            raise virtual.Empty()
        return got[0]

    def _size(self, queue: str) -> int:
        with self.client.pipeline(transaction=False) as pipe:
            for key in self.lists([queue]):
                pipe.llen(key)
            return sum(pipe.execute())

    def _purge(self, queue: str) -> int:
        return handover.empty(self.client, self.lists([queue]))

    def _delete(self, queue: str, exchange: str | None = None, routing_key: str = "",
                pattern: str = "", *args: Any, **kwargs: Any) -> None:
        if exchange:
            self.client.srem(BINDINGS_PREFIX + exchange,
                             PRIORITY_SEP.join((routing_key or "", pattern or "", queue)))
        self._purge(queue)

    def _has_queue(self, queue: str, **kwargs: Any) -> bool:
        return bool(self.client.exists(*self.lists([queue])))

    def _put_fanout(self, exchange: str, message: dict, routing_key: str,
                    **kwargs: Any) -> None:
        self.client.publish(FANOUT_PREFIX + exchange, dumps(message))

    def _queue_bind(self, exchange: str, routing_key: str, pattern: str, queue: str) -> None:
        if self.typeof(exchange).type == "fanout":
            self.fanout_of[queue] = exchange
        else:
            self.client.sadd(BINDINGS_PREFIX + exchange,
                             PRIORITY_SEP.join((routing_key or "", pattern or "", queue)))

    def get_table(self, exchange: str) -> list[tuple[str, str, str]]:
        members = self.client.smembers(BINDINGS_PREFIX + exchange)
        return [tuple(_text(member).split(PRIORITY_SEP, 2)) for member in members]

    def _restore(self, message: Any) -> None:
        """A message delivered here and not acked goes back to the front of its list, in
        the step that drops its record (a reject with requeue, a channel closed); if
        Redis does not answer, with the next take."""
        token = self.tokens.pop(message.delivery_tag, None)
        if token is None:  # a consumer that never acks: nothing recorded, pushed again
            return super()._restore(message)
        entered_at = lane_clock_of(message.serializable())
        try:
            handover.give_back(self.client, process_holder(), token, entered_at=entered_at)
        except OUTAGE:
            PENDING.returns[token] = entered_at
            log.warning("a message could not be given back (Redis did not answer); it is "
                        "given back before the next take")

    def _restore_at_beginning(self, message: Any) -> None:
        self._restore(message)

    # -- consuming -----------------------------------------------------------------------
    def basic_consume(self, queue: str, no_ack: bool, callback: Any, consumer_tag: str,
                      **kwargs: Any) -> Any:
        self.consuming[consumer_tag] = (queue, no_ack)
        self.ready = True
        self.connection.listen(self, queue)
        return super().basic_consume(queue, no_ack, callback, consumer_tag, **kwargs)

    def basic_cancel(self, consumer_tag: str) -> Any:
        self.consuming.pop(consumer_tag, None)
        return super().basic_cancel(consumer_tag)

    def basic_get(self, queue: str, no_ack: bool = False, **kwargs: Any) -> Any:
        got = self.take([queue], record=not no_ack)
        if got is None:
            return None
        message = self.Message(got[0], channel=self)
        if not no_ack:
            self.qos.append(message, message.delivery_tag)
        return message

    def deliver_next(self) -> bool:
        """Deliver one message to this channel's consumers, if one waits: a fanout
        message received, else the next of its queues (``take``). Whether one came."""
        while self.inbox:
            payload, queue = self.inbox.popleft()
            if any(queue == consumed for consumed, _ in self.consuming.values()):
                self.connection.on_message_ready(self, payload, queue)
                return True
        if not self.consuming or not self.qos.can_consume():
            return False
        if not self.ready and time.monotonic() - self.took_at < IDLE_TAKE_S:
            return False
        for no_ack in (False, True):  # a task consumer's queues, else replies' and the like
            queues = [q for q, n in self.consuming.values()
                      if n == no_ack and q not in self.fanout_of]
            if queues and (got := self.take(queues, record=not no_ack)) is not None:
                payload, queue = got
                self.connection.on_message_ready(self, payload, queue)
                return True
        self.ready, self.took_at = False, time.monotonic()
        return False

    def take(self, queues: list[str], record: bool) -> tuple[dict, str] | None:
        """Take the next message of ``queues`` (in order, each level by level): its
        payload and queue; None when they are all empty. An unreadable item is set
        aside (``handover.set_aside``) and the next one taken."""
        holder = process_holder()
        PENDING.settle(self.client, holder, record)
        while True:
            token, repeat = PENDING.unanswered or uuid.uuid4().hex, bool(PENDING.unanswered)
            PENDING.unanswered = token
            got = handover.take(self.client, holder, self.lists(queues), token,
                                repeat=repeat, record=record)
            PENDING.unanswered = ""
            self.took_at = time.monotonic()
            if got is None:
                return None
            try:
                payload = loads(got.raw)
                tag = payload["properties"]["delivery_tag"]
            except (ValueError, KeyError, TypeError) as exc:
                handover.set_aside(self.client, holder, got, f"{type(exc).__name__}: {exc}")
                continue
            if record:
                self.tokens[tag] = token
            return payload, got.key.split(PRIORITY_SEP, 1)[0]

    def settle(self, delivery_tag: str) -> None:
        """Drop the record of a message acked or rejected here; if Redis does not answer,
        with the next take (this process holds nothing it does not run)."""
        token = self.tokens.pop(delivery_tag, None)
        if token is None:
            return
        try:
            handover.ack(self.client, process_holder(), token)
        except OUTAGE:
            PENDING.acks.add(token)
            log.warning("an ack got no answer from Redis; it is sent again with the next take")

    # -- helpers -------------------------------------------------------------------------
    def lists(self, queues: Iterable[str]) -> list[str]:
        """The lists of ``queues``, in the order they are served."""
        return [list_key(queue, step) for queue in queues for step in self.priority_steps]

    def list_of(self, queue: str, message: dict) -> str:
        """The list ``message`` goes to: its queue's, at its priority level."""
        priority = (message.get("properties") or {}).get("priority") or 0
        steps = sorted(self.priority_steps)
        return list_key(queue, steps[max(0, bisect(steps, priority) - 1)])


class Bus:
    """The pub/sub connection, read by a thread of its own. What it hears, and the
    room an ack makes for a consumer at its prefetch limit, reach :meth:`wait`."""

    def __init__(self, client: redis.Redis) -> None:
        self.pubsub = client.pubsub(ignore_subscribe_messages=True)
        self.heard: queue.SimpleQueue = queue.SimpleQueue()
        self.reader: threading.Thread | None = None
        self.closed = False

    def subscribe(self, name: str, on_connect: Any) -> None:
        self.pubsub.subscribe(name)
        if self.reader is None:  # the connection exists now
            self.pubsub.connection.register_connect_callback(on_connect)
            self.reader = threading.Thread(target=self._read, name="gpulanes-bus", daemon=True)
            self.reader.start()

    def _read(self) -> None:
        while not self.closed:
            try:
                message = self.pubsub.get_message(timeout=1.0)
            except Exception as exc:  # noqa: BLE001  the consumer raises it
                if self.closed:
                    return
                self.heard.put(exc)
                time.sleep(0.5)
                continue
            if message is not None:
                self.heard.put(message)

    def nudge(self) -> None:
        """Wake :meth:`wait` with nothing heard (room was made)."""
        self.heard.put(None)

    def wait(self, timeout: float) -> list[dict]:
        """What was heard within ``timeout`` s (at least one thing, or nothing in time)."""
        try:
            got = [self.heard.get(timeout=timeout)]
        except queue.Empty:
            return []
        while True:
            try:
                got.append(self.heard.get_nowait())
            except queue.Empty:
                break
        for item in got:
            if isinstance(item, Exception):
                raise item
        return [item for item in got if item is not None]

    def close(self) -> None:
        self.closed = True
        self.pubsub.close()


class Transport(virtual.Transport):
    """The transport: one command client and one pub/sub connection per connection."""

    Channel = Channel
    driver_type = driver_name = "redis"  # Celery sends events over fanout, as on Redis
    can_parse_url = True
    polling_interval = None
    default_port = 6379
    implements = virtual.Transport.implements.extend(
        exchange_type=frozenset(["direct", "topic", "fanout"]))
    connection_errors = (*virtual.Transport.connection_errors, *OUTAGE)
    channel_errors = (*virtual.Transport.channel_errors, *OUTAGE)

    def __init__(self, client: Any, **kwargs: Any) -> None:
        super().__init__(client, **kwargs)
        options = client.transport_options
        self.commands = connect(broker_url(client), options.get("master_name"),
                                timeout_s=options.get("socket_timeout") or 5.0)
        self.bus: Bus | None = None
        self.listening: dict[str, list[Any]] = {}  # pub/sub channel -> (channel, queue)s

    def listen(self, channel: Channel, queue: str) -> None:
        """Wake ``channel`` for what arrives in ``queue`` (its fanout exchange's messages,
        or a push to its lists)."""
        exchange = channel.fanout_of.get(queue)
        name = FANOUT_PREFIX + exchange if exchange else WAKE_PREFIX + queue
        hearing = self.listening.setdefault(name, [])
        if (channel, queue) not in hearing:
            hearing.append((channel, queue))
        if self.bus is None:
            self.bus = Bus(self.commands)
        self.bus.subscribe(name, self._reconnected)

    def _reconnected(self, *_: Any) -> None:
        for channel in self.channels:
            channel.ready = True  # a wake-up may have gone out while it was away

    def room_made(self) -> None:
        """An ack or reject freed a place under a consumer's prefetch limit."""
        if self.bus is not None:
            self.bus.nudge()

    def drain_events(self, connection: Any, timeout: float | None = None) -> None:
        """Deliver one message, waiting for one at most ``timeout`` s (None: for ever)."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            if any(channel.deliver_next() for channel in list(self.channels)):
                return
            left = IDLE_TAKE_S if deadline is None else deadline - time.monotonic()
            if left <= 0:
                raise socket.timeout()
            self.hear(min(left, IDLE_TAKE_S))

    def hear(self, timeout: float) -> None:
        """Wait at most ``timeout`` s for what the pub/sub connection brings, and take
        in all that came: fanout messages to their channels, wake-ups as a flag."""
        if self.bus is None:
            time.sleep(timeout)
            return
        for message in self.bus.wait(timeout):
            name = _text(message["channel"])
            for channel, queue in self.listening.get(name, ()):
                if name.startswith(FANOUT_PREFIX):
                    channel.inbox.append((loads(message["data"]), queue))
                else:
                    channel.ready = True

    def close_connection(self, connection: Any) -> None:
        super().close_connection(connection)
        if self.bus is not None:
            self.bus.close()
        self.commands.close()


def broker_url(client: Any) -> str:
    """The Redis URL behind a ``gpulanes+...`` one (kombu splits ``;``-separated
    Sentinel addresses into alternates: joined again)."""
    urls = [url.split("+", 1)[1] if url.startswith("gpulanes+") else url
            for url in (client.alt or [client.hostname])]
    return ";".join(urls) if urls[0].startswith("sentinel://") else urls[0]


def _text(value: str | bytes) -> str:
    return value.decode() if isinstance(value, bytes) else value


kombu.transport.TRANSPORT_ALIASES.setdefault("gpulanes", "tasks.broker.lanes:Transport")
