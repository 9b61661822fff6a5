"""gpulanes' kombu transport: Redis lists, taken through the queue protocol's hand-over.

A kombu virtual transport (``kombu.transport.virtual``), built on the methods kombu
asks of one and nothing private of kombu's Redis transport or of Celery. It is
registered as ``gpulanes`` and chosen by a broker URL that names it:
``gpulanes+redis://host:6379/0``, ``gpulanes+redis+socket:///path``,
``gpulanes+sentinel://host:26379`` (with the ``master_name`` transport option; several
Sentinels go whole in the ``url`` option, which kombu does not split into alternates).

- Queues are Redis lists, one per priority level (``tasks.broker.bindings``); a consumer takes
  with ``tasks.broker.handover.take``: the next message of the first list, in the order
  the queues were consumed, recorded as this process's in the same step.
- An ack drops the record; a reject with requeue, or a channel closed with messages
  unacked, gives each back to the front of its list in the step that drops its record.
- Nothing polls: a take that finds nothing records its channel as idle on the queues it
  took from, and a push wakes one idle consumer of its queue, on that consumer's own
  pub/sub channel (``handover.take``). The transport waits on one pub/sub connection,
  subscribed to its channels' own and to the fanout exchanges their queues are bound
  to (Celery's remote control and events).
- Bindings of direct and topic exchanges are kept in Redis, for every process
  (``tasks.broker.bindings``).
- A message kombu publishes to a lane goes through the broker's publish
  (``tasks.broker.publish``) with no conditions; gpulanes' own publishers call that
  publish directly, with theirs.
"""
from __future__ import annotations

import logging
import socket
import time
import uuid
from collections import deque
from typing import Any, Callable, Iterable

import kombu.transport
import redis
from kombu.transport import virtual
from kombu.utils.json import dumps, loads

from tasks.broker import envelope, handover
from tasks.broker.bindings import PRIORITY_STEPS, Bindings, is_lane, list_of, lists
from tasks.broker.bus import Bus
from tasks.broker.holder import PENDING, TOKENS, give_back, settled
from tasks.broker.holder import holder as process_holder
from tasks.broker.keys import CONSUMER_WAKE_PREFIX, FANOUT_PREFIX, PRIORITY_SEP, wake_key
from tasks.broker.moves import lane_clock_of
from tasks.broker.outage import OUTAGE, stopping, when_stopping
from tasks.broker.publish import Message, publish
from tasks.broker.store import bare, connect

log = logging.getLogger(__name__)
#: Seconds an idle consumer waits on its wake-ups before it takes once anyway: for an
#: item pushed without a wake-up (a hand-typed LPUSH), a wake-up missed while its
#: connection was down, or one sent to a consumer frozen or gone since; not a poll (one
#: Lua call per idle period, which records it as idle again).
IDLE_TAKE_S = 5.0


class QoS(virtual.QoS):
    """kombu's prefetch accounting; an ack or a reject also settles the message's record."""

    def ack(self, delivery_tag: str) -> None:
        try:
            self.channel.settle(delivery_tag)
        finally:
            super().ack(delivery_tag)
            settled(delivery_tag, time.monotonic())
            self.room_made()

    def reject(self, delivery_tag: str, requeue: bool = False) -> None:
        try:
            if not requeue:  # with requeue, kombu gives it back (``Channel._restore``)
                self.channel.settle(delivery_tag)
        finally:
            super().reject(delivery_tag, requeue)
            settled(delivery_tag, time.monotonic())
            self.room_made()

    def room_made(self) -> None:
        """Wake the consumer: a place under its prefetch limit is free (none to wake
        once its channel closed). It takes at once: the next message, or else its
        record as idle, which no push finds while it is busy."""
        self.channel.ready = True
        if self.channel.connection is not None:
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
        self.bindings = Bindings(self.client)
        self.inbox: deque[tuple[dict, str]] = deque()  # fanout messages to deliver
        self.ready, self.took_at = True, 0.0
        #: This channel's own wake-up channel: a push to a queue it found empty wakes it.
        self.wake = CONSUMER_WAKE_PREFIX + uuid.uuid4().hex
        #: ``on_unreadable(problem, {"queue", "item"})``: what to do with an item taken
        #: that is not a message (None: set it aside, ``handover.set_aside``).
        self.on_unreadable: Callable[[str, dict[str, Any]], None] | None = None

    # -- the interface kombu asks of a virtual channel ----------------------------------
    def _put(self, queue: str, message: dict, **kwargs: Any) -> None:
        """Push ``message``; to a lane, through the broker's publish, with no conditions
        (it never refuses)."""
        key = list_of(queue, (message.get("properties") or {}).get("priority"),
                      self.priority_steps)
        if not is_lane(queue):
            return handover.push(self.client, key, dumps(message))
        publish(self.client, Message(queue, key, message, lane_clock_of(message)))

    def _get(self, queue: str, timeout: float | None = None) -> dict:
        got = self.take([queue], record=True)
        if got is None:
            raise virtual.Empty()
        return got[0]  # the payload

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
            self.bindings.unbind(exchange, routing_key, pattern, queue)
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
            self.bindings.bind(exchange, routing_key, pattern, queue)

    def get_table(self, exchange: str) -> list[tuple[str, str, str]]:
        return self.bindings.table(exchange)

    def _restore(self, message: Any) -> None:
        """A message delivered here and not acked goes back to the front of its list, in
        the step that drops its record (a reject with requeue, a channel closed); if
        Redis does not answer, with the next take."""
        token = TOKENS.pop(message.delivery_tag, None)
        if token is not None:  # else settled already: given back, or acked with its run
            give_back(self.client, token)

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
        queue, _ = self.consuming.pop(consumer_tag, (None, False))
        if queue is not None and all(queue != q for q, _ in self.consuming.values()):
            try:  # no push wakes it for that queue any more (else its record ages out)
                self.client.zrem(wake_key(queue), self.wake)
            except OUTAGE:
                pass
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
        groups = []
        for no_ack in (False, True):  # a task consumer's queues, then replies' and the like
            queues = [q for q, n in self.consuming.values()
                      if n == no_ack and q not in self.fanout_of]
            if queues:
                groups.append((queues, not no_ack))
        for queues, record in groups:
            if (got := self.take(queues, record, wake=self.wake)) is not None:
                # it takes again once it has room: the next message, or its idle record
                self.ready = True
                self.connection.on_message_ready(self, *got)
                return True
        self.ready, self.took_at = False, time.monotonic()
        return False

    def take(self, queues: list[str], record: bool, wake: str = "") -> tuple[dict, str] | None:
        """Take the next message of ``queues`` (in order, each level by level): its
        payload and its queue; None when they are all empty (``wake``: this channel's
        wake-up channel, recorded then as idle on them, ``handover.take``). An unreadable
        item is refused (:meth:`refuse`) and the next one taken."""
        holder = process_holder()
        PENDING.settle(self.client, holder)
        while True:
            token = PENDING.unanswered = PENDING.unanswered or uuid.uuid4().hex
            got = handover.take(self.client, holder, self.lists(queues), token, record=record,
                                wake=wake)
            PENDING.unanswered = ""
            self.took_at = time.monotonic()
            if got is None:
                return None
            try:
                payload = loads(got.raw)
            except ValueError as exc:
                payload, problem = None, f"a lane item that is not JSON: {exc}"
            else:
                problem = envelope.problem(payload)
            if problem is not None:
                self.refuse(got, problem)
                continue
            tag = payload["properties"]["delivery_tag"]
            if record:
                TOKENS[tag] = token
            return payload, got.key.split(PRIORITY_SEP, 1)[0]

    def refuse(self, taken: handover.Taken, problem: str) -> None:
        """An item that is not a message never reaches kombu (it would stop the consumer):
        handed to ``on_unreadable`` (a worker dead-letters it), else set aside."""
        queue = taken.key.split(PRIORITY_SEP, 1)[0]
        if self.on_unreadable is None:
            return handover.set_aside(self.client, process_holder(), taken, problem)
        self.on_unreadable(problem, {"queue": queue, "item": taken.raw})
        handover.ack(self.client, process_holder(), taken.token)

    def settle(self, delivery_tag: str) -> None:
        """Drop the record of a message acked or rejected here; if Redis does not answer,
        with the next take (this process holds nothing it does not run)."""
        token = TOKENS.pop(delivery_tag, None)
        if token is None:
            return
        try:
            handover.ack(self.client, process_holder(), token)
        except OUTAGE:
            PENDING.acks.add(token)
            log.warning("an ack got no answer from Redis; it is sent again with the next take")

    def lists(self, queues: Iterable[str]) -> list[str]:
        """The lists of ``queues``, in the order they are served (``bindings.lists``)."""
        return lists(queues, self.priority_steps)


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
        self.commands = connect(
            options.get("url") or broker_url(client), options.get("master_name"),
            timeout_s=options.get("socket_timeout") or 5.0,
            socket_connect_timeout=options.get("socket_connect_timeout") or 5.0)
        self.bus: Bus | None = None
        self.listening: dict[str, list[Any]] = {}  # pub/sub channel -> (channel, queue)s

    def establish_connection(self) -> Any:
        """kombu's, once Redis answers: a consumer that cannot reach it fails here, and
        Celery tries again with its backoff."""
        self.commands.ping()
        return super().establish_connection()

    def listen(self, channel: Channel, queue: str) -> None:
        """Wake ``channel`` for what arrives in ``queue`` (its fanout exchange's messages,
        or, on the channel's own wake-up channel, a push to its lists)."""
        exchange = channel.fanout_of.get(queue)
        name = FANOUT_PREFIX + exchange if exchange else channel.wake
        hearing = self.listening.setdefault(name, [])
        if (channel, queue) not in hearing:
            hearing.append((channel, queue))
        if self.bus is None:
            self.bus = Bus(self.commands)
            when_stopping(self.bus.nudge)
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
            if stopping():  # a worker told to stop takes no more work (and its
                raise socket.timeout()  # loop, back at once, sees that it is stopping)
            if any(channel.deliver_next() for channel in list(self.channels)):
                return
            left = IDLE_TAKE_S if deadline is None else deadline - time.monotonic()
            if left <= 0:
                raise socket.timeout()
            self.hear(min(left, IDLE_TAKE_S))

    def hear(self, timeout: float) -> None:
        """Wait at most ``timeout`` s for what the pub/sub connection brings, and take
        in all that came: fanout messages to their channels, wake-ups as a flag. A
        subscription Redis confirms is a wake-up too: a push made before it woke
        nobody, and a take tried before it may have come too early to find it."""
        if self.bus is None:
            time.sleep(timeout)
            return
        for message in self.bus.wait(timeout):
            name = _text(message["channel"])
            for channel, queue in self.listening.get(name, ()):
                if message["type"] == "message" and name.startswith(FANOUT_PREFIX):
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
    urls = [bare(url) for url in (client.alt or [client.hostname])]
    return ";".join(urls) if urls[0].startswith("sentinel://") else urls[0]


def _text(value: str | bytes) -> str:
    return value.decode() if isinstance(value, bytes) else value


kombu.transport.TRANSPORT_ALIASES.setdefault("gpulanes", "tasks.broker.lanes:Transport")
