"""kombu's Redis transport plus a ledger, so a worker killed mid-take loses no job.

kombu takes a message with ``BRPOP`` and records it as unacked in a second
command: a worker killed between the two (or shut down with the reply still
in its socket buffer) takes the message with it, and nothing in Redis says it
ever existed. gpulanes keeps a ledger instead, in the same Redis:

- every publish is one Lua call that pushes the message and writes it to the
  ledger (``routing.names.LEDGER_KEY``: delivery tag -> list key and message),
  so a publish costs the same one round trip as before;
- a worker removes the message's ledger entry in the same transaction that
  records it as unacked, and every message kombu puts back (a dead worker's,
  a rejected one) is written to the ledger again in the transaction that
  pushes it;
- beat (``beat.ledger``) compares the ledger with what the lists hold and
  republishes a message that is in neither a list nor unacked nor finished.

The same Lua call enforces a lane's maximum depth for new jobs: inside
:func:`lane_limit` (``submit()``) it sums the lengths of every list of the lane
and pushes only below the limit, else :class:`LaneAtLimit` is raised and
nothing is written. Any number of submitters together never pass the limit.
Messages published outside it (retries, restores) are never refused: a job
once accepted is not dropped for want of room.

Installed for every ``redis://``, ``rediss://``, ``redis+socket://`` and
``sentinel://`` broker URL by :func:`install` (``tasks.celeryapp``).
"""
from __future__ import annotations

import time
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Any, Iterator

import redis
from kombu.transport import TRANSPORT_ALIASES
from kombu.transport import redis as kombu_redis
from kombu.utils.json import dumps, loads

from routing.names import LANES, LEDGER_KEY, lane_of, lists_key

# KEYS: list, ledger, the lane's lists. ARGV: message, delivery tag, the lane's
# maximum depth (0: none). Returns 0, having written nothing, when the lane is full.
# The lane's lists are read by name from its set: a standalone Redis allows it.
# A call retried after its reply was lost finds its own entry and does nothing.
_PUT = """
if redis.call('HEXISTS', KEYS[2], ARGV[2]) == 1 then return 1 end
local limit = tonumber(ARGV[3])
if limit > 0 then
  local depth = 0
  for _, key in ipairs(redis.call('SMEMBERS', KEYS[3])) do
    depth = depth + redis.call('LLEN', key)
  end
  if depth >= limit then return 0 end
end
redis.call('LPUSH', KEYS[1], ARGV[1])
redis.call('HSET', KEYS[2], ARGV[2], KEYS[1] .. '\\n' .. ARGV[1])
redis.call('SADD', KEYS[3], KEYS[1])
return 1
"""

_put_script: list[Any] = []
#: The maximum depth of the lane a publish in this context goes to (0: no limit).
_limit: ContextVar[int] = ContextVar("gpulanes_lane_limit", default=0)


class LaneAtLimit(Exception):
    """A publish inside :func:`lane_limit` found its lane at its maximum depth."""

    def __init__(self, lane: str, limit: int) -> None:
        super().__init__(f"lane {lane!r} holds {limit} queued jobs, its maximum")
        self.lane, self.limit = lane, limit


@contextmanager
def lane_limit(depth: int) -> Iterator[None]:
    """Publishes to a lane made in this block raise :class:`LaneAtLimit` instead of
    passing ``depth`` jobs queued in that lane (every list of it, every worker's)."""
    token = _limit.set(depth)
    try:
        yield
    finally:
        _limit.reset(token)


def _put(client: redis.Redis, lane: str, key: str, payload: str, tag: str, limit: int) -> bool:
    if not _put_script:  # registered once per process, run on any client
        _put_script.append(client.register_script(_PUT))
    return bool(_put_script[0](keys=[key, LEDGER_KEY, lists_key(lane)],
                               args=[payload, tag, limit], client=client))


def ledger_entry(key: str, payload: str) -> str:
    """What the ledger holds for a message in list ``key``."""
    return f"{key}\n{payload}"


def parse_entry(entry: str | bytes) -> tuple[str, str]:
    """(list key, message) of a ledger entry."""
    text = entry.decode() if isinstance(entry, bytes) else entry
    key, _, payload = text.partition("\n")
    return key, payload


class LedgerQoS(kombu_redis.QoS):
    def append(self, message: Any, delivery_tag: str) -> None:
        """Record the message as unacked and drop its ledger entry, in one transaction."""
        delivery = message.delivery_info
        with self.pipe_or_acquire() as pipe:
            pipe.zadd(self.unacked_index_key, {delivery_tag: time.time()}) \
                .hset(self.unacked_key, delivery_tag,
                      dumps([message._raw, delivery["exchange"], delivery["routing_key"]])) \
                .hdel(LEDGER_KEY, delivery_tag) \
                .execute()
            super(kombu_redis.QoS, self).append(message, delivery_tag)  # kombu's bookkeeping


class LedgerChannel(kombu_redis.Channel):
    QoS = LedgerQoS

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        if self.global_keyprefix:  # kombu would prefix only the first key of our scripts
            raise ValueError("gpulanes' transport does not support kombu's global_keyprefix; "
                             "give each cluster its own Redis database instead")

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
            batch.add("eval", _PUT, 3, key, LEDGER_KEY, lists_key(lane), payload, tag, 0)
            return
        limit = _limit.get()
        with self.conn_or_acquire() as client:
            if not _put(client, lane, key, payload, tag, limit):
                raise LaneAtLimit(lane, limit)

    def _do_restore_message(self, payload: dict, exchange: str, routing_key: str,
                            pipe: Any, leftmost: bool = False) -> None:
        """kombu's restore, each push written to the ledger in the same transaction."""
        super()._do_restore_message(payload, exchange, routing_key, pipe, leftmost)
        try:
            tag = payload["properties"]["delivery_tag"]
            for queue in filter(_is_lane, self._lookup(exchange, routing_key)):
                key = self._q_for_pri(queue, self._get_message_priority(payload, reverse=False))
                pipe.hset(LEDGER_KEY, tag, ledger_entry(key, dumps(payload))) \
                    .sadd(lists_key(lane_of(queue)), key)
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
        """Empty every priority list of ``queue`` in one transaction; drop their entries."""
        keys = [self._q_for_pri(queue, pri) for pri in self.priority_steps]
        with self.conn_or_acquire() as client:
            with client.pipeline() as pipe:  # MULTI: read and delete at one instant
                for key in keys:
                    pipe.lrange(key, 0, -1).delete(key)
                held = pipe.execute()[::2]
            if tags := [t for raws in held for t in map(_tag, raws) if t]:
                client.hdel(LEDGER_KEY, *tags)
        return sum(map(len, held))


def _is_lane(queue: str) -> bool:
    """A lane or a worker's own queue of one: the queues jobs wait in."""
    return lane_of(queue) in LANES


def _tag(raw: bytes | str) -> str | None:
    try:
        return loads(raw)["properties"]["delivery_tag"]
    except (ValueError, KeyError, TypeError):
        return None


class Transport(kombu_redis.Transport):
    Channel = LedgerChannel


class SentinelLedgerChannel(kombu_redis.SentinelChannel, LedgerChannel):
    pass


class SentinelTransport(kombu_redis.SentinelTransport):
    Channel = SentinelLedgerChannel


def install() -> None:
    """Make kombu build this transport for every Redis broker URL of this process."""
    TRANSPORT_ALIASES.update(redis=f"{__name__}:Transport", rediss=f"{__name__}:Transport",
                             sentinel=f"{__name__}:SentinelTransport")
