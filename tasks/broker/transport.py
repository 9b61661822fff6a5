"""kombu's Redis transport plus a ledger, so a worker killed mid-take loses no job.

kombu takes a message with ``BRPOP`` and records it as unacked in a second
command: a worker killed between the two (or shut down with the reply still
in its socket buffer) takes the message with it, and nothing in Redis says it
ever existed. gpulanes keeps a ledger instead, in the same Redis:

- every publish is one Lua call that pushes the message and writes it to the
  ledger (``tasks.broker.keys.LEDGER_KEY``: delivery tag -> list key and message),
  so a publish costs the same one round trip as before;
- a worker removes the message's ledger entry in the same transaction that
  records it as unacked, and every message kombu puts back (a dead worker's,
  a rejected one) is written to the ledger again in the transaction that
  pushes it;
- beat (``beat.ledger``) compares the ledger with what the lists hold and
  republishes a message that is in neither a list nor unacked nor finished.

The same Lua call checks what the publisher asked for (``tasks.broker.publish``:
lane limits, deadlines, fast places, claims, fences) before it writes anything.

Every message put back on a list (kombu's restores after the visibility
timeout or a warm shutdown, a requeue, beat's put-backs) gets a new delivery
tag, so a worker that held the old copy, should it wake up, can only ever ack,
reject or restore its own dead copy, never the new one. A worker records which
process holds a message in the transaction that records it unacked, and an
ack drops that record with kombu's.

gpulanes' app builds it for its ``redis://``, ``rediss://``, ``redis+socket://`` and
``sentinel://`` broker URLs through :class:`Connection` (``tasks.broker.app``); kombu's
names for its own transports are left as they are, for any other app of the process.
"""
from __future__ import annotations

import time
import uuid
from dataclasses import replace
from typing import Any

import kombu
import kombu.connection
import redis
from kombu.transport import redis as kombu_redis
from kombu.utils.json import dumps, loads

from routing.names import LANES, lane_of
from tasks.broker import envelope, failover, leader, scripts
from tasks.broker.holder import acked_earlier, holder, noting_unanswered, settled
from tasks.broker.keys import (
    BEAT_EPOCH_KEY,
    DEAD_KEY,
    DUE_PREFIX,
    HOLDERS_KEY,
    LEDGER_BOOK,
    done_key,
    due_clock,
    lease_key,
    lists_key,
)
from tasks.broker.moves import lane_clock_of
from tasks.broker.outage import refusal_parser, watched
from tasks.broker.publish import (RELEASED, ClaimAnswered, Conditions, _put, _put_call, current,
                                  refusal)
from tasks.broker.store import ONE_RECONNECT, FollowingConnection, FollowingSSLConnection
from tasks.settings import settings

class LedgerQoS(kombu_redis.QoS):
    def append(self, message: Any, delivery_tag: str) -> None:
        """Record the message as unacked (and who holds it) and drop its ledger entry with
        its list's and lane's depths, in one step (``lua/take.lua``)."""
        delivery = message.delivery_info
        record = dumps([message._raw, delivery["exchange"], delivery["routing_key"]])
        # unanswered, it may still run later: its message would be recorded here, taken
        # and never delivered (kombu drops it with the error): an orphan to settle
        with noting_unanswered(), self.channel.conn_or_acquire() as client:
            scripts.run(client, "take", [self.unacked_index_key, self.unacked_key, HOLDERS_KEY,
                                         *LEDGER_BOOK],
                        [delivery_tag, time.time(), record, holder(),
                         DUE_PREFIX, getattr(self.channel, "popped_from", "")])
        super(kombu_redis.QoS, self).append(message, delivery_tag)  # kombu's bookkeeping

    def _remove_from_indices(self, delivery_tag: str, pipe: Any = None) -> Any:
        """kombu's unacked records of ``delivery_tag``, and its holder, dropped (a restore,
        and beat's put-backs): one copy's records only, a copy put back gets a new tag."""
        return super()._remove_from_indices(delivery_tag, pipe).hdel(HOLDERS_KEY, delivery_tag)

    def ack(self, delivery_tag: str) -> None:
        """Drop the message's records, fenced: only if this process still holds it (an
        AOF that lost its last second can hand the same tag to another worker).

        kombu's count of messages in hand drops even when Redis does not answer: with
        prefetch 1 a worker that kept it would never take another job. The records left
        behind are what ``gpu_worker.hooks.settle_orphans`` finds once Redis answers."""
        try:
            if not acked_earlier(delivery_tag):
                self._drop_if_mine(delivery_tag)
        finally:
            super(kombu_redis.QoS, self).ack(delivery_tag)
            settled(delivery_tag, time.monotonic())

    def restore_by_tag(self, tag: str, client: Any = None, leftmost: bool = False) -> None:
        """kombu's restore of one message (a requeue, a channel that closes), whose
        transaction raises an outage rather than trying again at once: redis-py would
        for as long as Redis refuses (``tasks.broker.outage.watched``)."""
        def restore(pipe: redis.client.Pipeline) -> None:
            raw = pipe.hget(self.unacked_key, tag)
            pipe.multi()
            self._remove_from_indices(tag, pipe)
            if raw:
                self.channel._do_restore_message(*loads(_text(raw)), pipe, leftmost)

        with self.channel.conn_or_acquire(client) as client:
            watched(client, restore, self.unacked_key)

    def reject(self, delivery_tag: str, requeue: bool = False) -> None:
        if requeue:
            try:
                return super().reject(delivery_tag, requeue)
            finally:
                settled(delivery_tag, time.monotonic())
        self.ack(delivery_tag)

    def _drop_if_mine(self, delivery_tag: str) -> None:
        with noting_unanswered(), self.channel.conn_or_acquire() as client:
            scripts.run(client, "drop_if_mine",
                        [HOLDERS_KEY, self.unacked_key, self.unacked_index_key],
                        [delivery_tag, holder()])


class LedgerChannel(kombu_redis.Channel):
    QoS = LedgerQoS

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self._tables: dict[str, tuple[float, list]] = {}
        self._command_client: redis.Redis | None = None
        self.popped_from = ""  # the list of the message BRPOP is delivering, if any
        super().__init__(*args, **kwargs)
        if self.global_keyprefix:  # kombu would prefix only the first key of our scripts
            raise ValueError("gpulanes' transport does not support kombu's global_keyprefix; "
                             "give each cluster its own Redis database instead")

    def _connparams(self, asynchronous: bool = False) -> dict[str, Any]:
        params = super()._connparams(asynchronous)
        # a refusal is an outage, to kombu too
        params["parser_class"] = refusal_parser(params.get("protocol"))
        if not asynchronous:  # commands (not BRPOP/LISTEN): survive one broken connection
            params["retry"] = ONE_RECONNECT
        return params

    def _create_client(self, asynchronous: bool = False) -> redis.Redis:
        """kombu makes a client per command; one per channel and pool is enough (a
        client is only its pool's handle): about 15 us less per publish."""
        if asynchronous:
            return super()._create_client(asynchronous)
        client = self._command_client
        if client is None or client.connection_pool is not self.pool:
            client = self._command_client = super()._create_client()
        return client

    def _lookup(self, exchange: str, routing_key: str, default: Any = None) -> list[str]:
        """kombu's; a job sent to a worker's own queue that no worker has bound (its
        binding gone, or never made) goes to the shared lane of that queue's lane, where
        any worker takes it. kombu would drop it, and its caller would never know."""
        found = super()._lookup(exchange, routing_key, default)
        if not found and exchange and _is_lane(exchange):
            return [lane_of(exchange)]
        return found

    def _brpop_read(self, **options: Any) -> Any:
        """kombu's, remembering the list BRPOP named (priority level and all) while the
        message is delivered: its take counts it out of that list without reading its
        ledger entry (``lua/take.lua``)."""
        client = self.client
        parse = client.parse_response

        def remember(connection: Any, command: str, **kwargs: Any) -> Any:
            reply = parse(connection, command, **kwargs)
            self.popped_from = _text(reply[0]) if reply else ""
            return reply

        client.parse_response = remember
        try:
            return super()._brpop_read(**options)
        finally:
            del client.parse_response
            self.popped_from = ""

    def get_table(self, exchange: str) -> list:
        """kombu reads an exchange's bindings on every publish (one round trip); a
        lane's change only when a worker declares or deletes its own queue, so a lane
        exchange's are kept ``TABLE_KEPT_S`` (an empty one never: nothing bound yet)."""
        if not _is_lane(exchange):
            return super().get_table(exchange)
        now, kept = time.monotonic(), self._tables.get(exchange)
        if kept is not None and now - kept[0] < TABLE_KEPT_S:
            return kept[1]
        table = super().get_table(exchange)
        if table:
            self._tables[exchange] = (now, table)
        return table

    def _queue_bind(self, exchange: str, routing_key: str, pattern: str, queue: str) -> None:
        self._tables.pop(exchange, None)  # this process's own binds are seen at once
        super()._queue_bind(exchange, routing_key, pattern, queue)

    def _put(self, queue: str, message: dict, **kwargs: Any) -> None:
        """Push ``message`` and write its ledger entry (one Lua call: one round trip)."""
        if not _is_lane(queue):  # control replies and the like: kombu's own way
            return super()._put(queue, message, **kwargs)
        if self._expires and queue in self._expires:
            raise NotImplementedError("gpulanes queues have no x-expires")
        key = self._q_for_pri(queue, self._get_message_priority(message, reverse=False))
        payload, tag, lane = dumps(message), message["properties"]["delivery_tag"], lane_of(queue)
        batch = kwargs.pop("_publish_batch", None)
        if batch is not None:  # one script per message keeps it atomic in a batch too;
            # kombu's batches report no refusal back, so they are never limited
            when = Conditions(entered_at=lane_clock_of(message))
            keys, args = _put_call(key, lane, payload, tag, "", when)
            batch.add("eval", scripts.source("put"), len(keys), *keys, *args)
            return
        when, outcome = current()
        if not when.entered_at:  # a publish that did not say (a retry's, kombu's own)
            when = replace(when, entered_at=lane_clock_of(message))
        with self.conn_or_acquire() as client:
            verdict = _put(client, lane, key, payload, tag,
                           (message.get("headers") or {}).get("id") or "", when)
        if isinstance(verdict, ClaimAnswered):  # nothing pushed: the cache answered
            outcome.refusal = verdict
        elif verdict < 1:  # raised by ``publishing`` once the publish has left kombu
            outcome.refusal = refusal(verdict, lane, when.limit)

    def _do_restore_message(self, payload: dict, exchange: str, routing_key: str,
                            pipe: Any, leftmost: bool = False) -> None:
        """kombu's restore under a new delivery tag, written to the ledger in the same
        transaction: the copy that was taken keeps its tag, and with it only its own
        records. A lapsed lease of the job is marked released in the same step: the run
        that let it lapse (frozen, cut off) cannot take it again, the put-back copy can."""
        tag = str(uuid.uuid4())
        try:
            payload = envelope.with_tag(payload, tag)
        except (KeyError, TypeError):  # not an envelope: kombu logs what it cannot restore
            return super()._do_restore_message(payload, exchange, routing_key, pipe, leftmost)
        super()._do_restore_message(payload, exchange, routing_key, pipe, leftmost)
        try:
            clock = lane_clock_of(payload)
            for queue in filter(_is_lane, self._lookup(exchange, routing_key)):
                key = self._q_for_pri(queue, self._get_message_priority(payload, reverse=False))
                scripts.run(pipe, "ledger_put", [*LEDGER_BOOK, lists_key(lane_of(queue))],
                            [tag, key, dumps(payload), repr(due_clock(key, clock)), DUE_PREFIX])
            if job_id := envelope.job_id(payload):  # a lapsed lease can no longer be taken again
                pipe.set(lease_key(job_id), f"{RELEASED}put-back", nx=True,
                         ex=settings.runs_kept_s)
        except self.connection_errors:
            raise  # abort the transaction, as kombu's own restore does
        except Exception:  # noqa: BLE001  kombu logs what it could not restore
            return

    def _purge(self, queue: str) -> int:
        """kombu's purge; the purged messages leave the ledger too."""
        return self._drop_lists(queue)

    def _delete(self, queue: str, *args: Any, **kwargs: Any) -> None:
        """kombu's queue delete; the deleted messages leave the ledger too."""
        self._drop_lists(queue)
        super()._delete(queue, *args, **kwargs)

    def _drop_lists(self, queue: str) -> int:
        """Empty every priority list of ``queue``, their ledger entries, depths and due
        index with them, in one step (``lua/purge.lua``)."""
        keys = [self._q_for_pri(queue, pri) for pri in self.priority_steps]
        with self.conn_or_acquire() as client:
            return int(scripts.run(client, "purge", [*LEDGER_BOOK, *keys], [DUE_PREFIX]))


#: Seconds a channel keeps a lane exchange's bindings before it reads them again.
TABLE_KEPT_S = 5.0


def holder_of(lease: str | None) -> str | None:
    """The worker process named in a job's lease (``"<host/pid/start>#<run>#<tag>"``)."""
    return lease.split("#", 1)[0] if lease else None


def put_back_held(channel: Any, client: redis.Redis, tag: str, holder: str,
                  unless_running: bool = True) -> bool:
    """Put the message ``tag`` back at the front of its lane, under a new tag, if
    ``holder`` still holds it; a message whose job already finished (or failed for
    good) is only dropped.

    ``unless_running``: leave it while ``holder`` still holds the job's lease (a warm
    shutdown runs it, silent to heartbeats). One transaction that re-checks the
    holder, the record and the lease, so a message that meanwhile went elsewhere, or
    a lease taken again meanwhile, stays as it is; made by beat, it re-checks beat's
    epoch too (``tasks.broker.leader``): an old leader puts nothing back.
    """
    qos, epoch = channel.qos, leader.epoch()

    def move(pipe: redis.client.Pipeline) -> bool:
        if epoch and _text(pipe.get(BEAT_EPOCH_KEY)) != epoch:
            return False  # another beat leads now: fenced off (the epoch is watched)
        if _text(pipe.hget(HOLDERS_KEY, tag)) != holder:
            return False
        raw = pipe.hget(qos.unacked_key, tag)
        message, exchange, routing_key = loads(raw) if raw else (None, None, None)
        job_id = envelope.job_id(message)
        if job_id:
            pipe.watch(lease_key(job_id))
            if unless_running and holder_of(_text(pipe.get(lease_key(job_id)))) == holder:
                return False
        finished = bool(job_id) and bool(pipe.exists(done_key(job_id))
                                         or pipe.hexists(DEAD_KEY, job_id))
        pipe.multi()
        qos._remove_from_indices(tag, pipe)
        if message and not finished:
            channel._do_restore_message(message, exchange, routing_key, pipe)
        return bool(raw) and not finished

    return watched(client, move, HOLDERS_KEY, qos.unacked_key, BEAT_EPOCH_KEY)


def _text(value: bytes | str | None) -> str | None:
    return value.decode() if isinstance(value, bytes) else value


def _is_lane(queue: str) -> bool:
    """A lane or a worker's own queue of one: the queues jobs wait in."""
    return lane_of(queue) in LANES


#: kombu's Redis transport members this module overrides or relies on: pinned to the
#: kombu minor the suite runs on (setup.cfg); tests/test_kombu_hooks.py names any gone.
KOMBU_HOOKS = {
    kombu_redis.QoS: ("append", "ack", "reject", "restore_by_tag", "_remove_from_indices",
                      "unacked_key", "unacked_index_key", "channel"),
    kombu_redis.Channel: ("QoS", "_connparams", "_put", "_do_restore_message", "_purge",
                          "_delete", "_q_for_pri", "_get_message_priority", "_lookup",
                          "_create_client", "get_table", "_queue_bind", "pool",
                          "conn_or_acquire", "priority_steps", "global_keyprefix", "_expires",
                          "connection_errors", "_brpop_read", "client"),
    kombu_redis.Transport: ("Channel",),
    kombu_redis.SentinelTransport: ("Channel",),
    kombu_redis.SentinelChannel: ("connection_class", "connection_class_ssl",
                                  "_sentinel_managed_pool"),
    kombu.Connection: ("get_transport_cls", "Pool", "_info"),
    kombu.connection.ConnectionPool: ("new",),
}


class Transport(kombu_redis.Transport):
    Channel = LedgerChannel


class SentinelLedgerChannel(kombu_redis.SentinelChannel, LedgerChannel):
    # a connection whose reply timed out is closed, never reused (a frozen primary)
    connection_class = FollowingConnection
    connection_class_ssl = FollowingSSLConnection

    def _sentinel_managed_pool(self, asynchronous: bool = False) -> Any:
        return failover.follow(super()._sentinel_managed_pool(asynchronous))


class SentinelTransport(kombu_redis.SentinelTransport):
    Channel = SentinelLedgerChannel


#: The transport gpulanes builds for each of kombu's Redis transport names.
TRANSPORTS: dict[str, type] = {"redis": Transport, "rediss": Transport,
                               "sentinel": SentinelTransport}


class Connection(kombu.Connection):
    """kombu's connection, building gpulanes' transport where kombu's URL names one of
    its Redis transports (``TRANSPORTS``); its clones and its pool's connections too."""

    def get_transport_cls(self) -> type:
        name = self.transport_cls
        if isinstance(name, str) and name in TRANSPORTS:
            return TRANSPORTS[name]
        return super().get_transport_cls()

    def Pool(self, limit: int | None = None, **kwargs: Any) -> kombu.connection.ConnectionPool:
        return _ConnectionPool(self, limit=limit, **kwargs)


class _PooledConnection(kombu.connection.PooledConnection, Connection):
    pass


class _ConnectionPool(kombu.connection.ConnectionPool):
    def new(self) -> _PooledConnection:
        return _PooledConnection(self, **dict(self.connection._info(resolve=False)))
