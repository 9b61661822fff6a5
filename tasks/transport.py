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

The same Lua call checks, before it writes anything, what the publisher asked
for in :func:`publishing` and refuses the whole publish if one fails:

- a lane's maximum depth for new jobs (``submit()``): it sums the lengths of
  every list of the lane and pushes only below the limit, else
  :class:`LaneAtLimit`. Any number of submitters together never pass the
  limit. Messages published outside it (retries, restores) are never refused:
  a job once accepted is not dropped for want of room;
- a deadline (``submit()``): a publish that reaches Redis after its caller gave
  up (a Redis frozen for a while executes what was sent meanwhile) writes
  nothing (:class:`PublishRefused`, ``late``);
- the account's fast place (a fast job, ``tasks.fastlimit``): taken in the
  same step, so a refused or failed publish leaves no place behind;
- the run of a result-cache claim is confirmed (``tasks.cache``): a claim whose
  job was never published lapses by itself and no caller waits on it;
- a fence (a worker's retry of its job, ``tasks.generate``): only the run that
  still holds the job may publish its next copy, and the same step releases
  the run's lease.

Every message put back on a list (kombu's restores after the visibility
timeout or a warm shutdown, a requeue, beat's put-backs) gets a new delivery
tag, so a worker that held the old copy, should it wake up, can only ever ack,
reject or restore its own dead copy, never the new one. A worker records which
process holds a message in the transaction that records it unacked, and an
ack drops that record with kombu's.

Installed for every ``redis://``, ``rediss://``, ``redis+socket://`` and
``sentinel://`` broker URL by :func:`install` (``tasks.celeryapp``).
"""
from __future__ import annotations

import time
import uuid
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Any, Iterator

import redis
from kombu.transport import TRANSPORT_ALIASES
from kombu.transport import redis as kombu_redis
from kombu.utils.json import dumps, loads

import celeryconfig as cfg
from routing.names import (DEAD_KEY, HOLDERS_KEY, LANES, LEDGER_KEY, done_key, lane_of,
                           lease_key, lists_key)
from routing.store import ONE_RECONNECT

#: A lease a run handed over (its retry published, or its message put back) reads
#: ``RELEASED`` + the run number: the old run can never take it again, and the next
#: run begins as if it were free. Kept as long as a job's run counter.
RELEASED = "released#"
#: Lua: whether the run ``token`` (run number ``n``) still holds its job: the lease
#: is its own, or lapsed with no newer run begun (``gpu_worker.lease``).
HOLDS = """
local function holds(lease_key, counter_key, token, n)
  local lease = redis.call('GET', lease_key)
  if lease then return lease == token end
  return tonumber(redis.call('GET', counter_key) or '0') == tonumber(n)
end
"""

# KEYS: list, ledger, the lane's lists, then (or '' when unused) the account's fast
# places, a claimed run's pointer and hash, the job's lease and run counter.
# ARGV: message, delivery tag, the lane's maximum depth (0: none), deadline (Redis'
# unix s, 0: none), fast places allowed (0: take none), place lapse s, job id, run ttl
# s, fence token ('' : none), the fenced run's number, how long a released lease is
# kept.
# Returns 1 (pushed), or a refusal having written nothing: 0 the lane is full,
# -1 too late, -2 the account's fast places are taken, -3 the fence does not hold.
# The lane's lists are read by name from its set: a standalone Redis allows it.
# The same message published again (same delivery tag) before a worker took it finds
# its own ledger entry and does nothing. (Celery gives every publish a new tag: a
# retry's publish tried again is stopped by its fence instead, the lease released.)
_PUT = HOLDS + """
if redis.call('HEXISTS', KEYS[2], ARGV[2]) == 1 then return 1 end
local t = redis.call('TIME')
local now = tonumber(t[1]) + tonumber(t[2]) / 1e6
if tonumber(ARGV[4]) > 0 and now > tonumber(ARGV[4]) then return -1 end
if ARGV[9] ~= '' and not holds(KEYS[7], KEYS[8], ARGV[9], ARGV[10]) then return -3 end
local limit = tonumber(ARGV[3])
if limit > 0 then
  local depth = 0
  for _, key in ipairs(redis.call('SMEMBERS', KEYS[3])) do
    depth = depth + redis.call('LLEN', key)
  end
  if depth >= limit then return 0 end
end
local places = tonumber(ARGV[5])
if places > 0 then
  redis.call('ZREMRANGEBYSCORE', KEYS[4], '-inf', now)
  if redis.call('ZCARD', KEYS[4]) >= places then return -2 end
  redis.call('ZADD', KEYS[4], now + tonumber(ARGV[6]), ARGV[7])
  redis.call('EXPIRE', KEYS[4], math.ceil(tonumber(ARGV[6])) + 60)
end
if KEYS[5] ~= '' and redis.call('GET', KEYS[5]) == ARGV[7] then
  redis.call('EXPIRE', KEYS[5], ARGV[8])
  redis.call('HSET', KEYS[6], 'confirmed', '1')
  redis.call('EXPIRE', KEYS[6], ARGV[8])
end
if ARGV[9] ~= '' then
  redis.call('SET', KEYS[7], '%s' .. ARGV[10], 'EX', ARGV[11])
end
redis.call('LPUSH', KEYS[1], ARGV[1])
redis.call('HSET', KEYS[2], ARGV[2], KEYS[1] .. '\\n' .. ARGV[1])
redis.call('SADD', KEYS[3], KEYS[1])
return 1
""" % RELEASED

_put_script: list[Any] = []
# KEYS: holders, kombu's unacked hash and index. ARGV: delivery tag, this process.
# An ack: the message's records go, unless another process holds that tag now.
_DROP_IF_MINE = """
local who = redis.call('HGET', KEYS[1], ARGV[1])
if who and ARGV[2] ~= '' and who ~= ARGV[2] then return 0 end
redis.call('HDEL', KEYS[1], ARGV[1])
redis.call('HDEL', KEYS[2], ARGV[1])
redis.call('ZREM', KEYS[3], ARGV[1])
return 1
"""
_drop_script: list[Any] = []
#: The identity ("host/pid/start") of the worker process consuming here, if any.
_holder: list[str] = []


@dataclass(frozen=True)
class Conditions:
    """What a publish must satisfy, checked in the same step as the push."""

    limit: int = 0                    #: the lane's maximum depth (0: none)
    deadline: float = 0.0             #: unix s after which the publish is refused (0: none)
    fast_places: tuple[str, int, float] | None = None  #: (key, allowed, lapse s)
    run: tuple[str, str, int] | None = None  #: a claimed run: (pointer, hash, ttl s)
    #: (lease, counter, token, run number, seconds a released lease is kept)
    fence: tuple[str, str, str, int, int] | None = None


@dataclass
class _Outcome:
    """A refusal the publish script returned, raised once the publish has left kombu."""

    refusal: Exception | None = None


_conditions: ContextVar[tuple[Conditions, _Outcome]] = ContextVar(
    "gpulanes_publish", default=(Conditions(), _Outcome()))


class LaneAtLimit(Exception):
    """A publish inside :func:`publishing` found its lane at its maximum depth."""

    def __init__(self, lane: str, limit: int) -> None:
        super().__init__(f"lane {lane!r} holds {limit} queued jobs, its maximum")
        self.lane, self.limit = lane, limit


class PublishRefused(Exception):
    """A publish inside :func:`publishing` failed a condition; nothing was written.
    ``why``: ``late``, ``fast_places`` or ``fence``."""

    def __init__(self, why: str) -> None:
        super().__init__(f"publish refused: {why}")
        self.why = why


_REFUSALS = {-1: "late", -2: "fast_places", -3: "fence"}


@contextmanager
def publishing(**conditions: Any) -> Iterator[None]:
    """Publishes to a lane made in this block meet :class:`Conditions` or write nothing:
    :class:`LaneAtLimit` or :class:`PublishRefused` is raised as the block ends.

    Not from inside the publish: kombu replaces a pooled connection whenever an error
    crosses its producer, and a refusal is routine (a full lane, a flooding account).
    """
    outcome = _Outcome()
    token = _conditions.set((Conditions(**conditions), outcome))
    try:
        yield
    finally:
        _conditions.reset(token)
    if outcome.refusal is not None:
        raise outcome.refusal


def lane_limit(depth: int) -> Any:
    """Publishes to a lane made in this block raise :class:`LaneAtLimit` instead of
    passing ``depth`` jobs queued in that lane (every list of it, every worker's)."""
    return publishing(limit=depth)


def set_holder(identity: str) -> None:
    """Name the worker process that consumes here: its takes record it as holder
    ('' : none)."""
    _holder[:] = [identity] if identity else []


def _put_call(key: str, lane: str, payload: str, tag: str, job_id: str,
              when: Conditions) -> tuple[list[str], list[Any]]:
    """The KEYS and ARGV of ``_PUT``."""
    places, allowed, lapse_s = when.fast_places or ("", 0, 0)
    pointer, run, run_ttl_s = when.run or ("", "", 0)
    lease, counter, token, attempt, kept_s = when.fence or ("", "", "", 0, 0)
    return ([key, LEDGER_KEY, lists_key(lane), places, pointer, run, lease, counter],
            [payload, tag, when.limit, when.deadline, allowed, lapse_s, job_id, run_ttl_s,
             token, attempt, kept_s])


def _put(client: redis.Redis, lane: str, key: str, payload: str, tag: str, job_id: str,
         when: Conditions) -> int:
    if not _put_script:  # registered once per process, run on any client
        _put_script.append(client.register_script(_PUT))
    keys, args = _put_call(key, lane, payload, tag, job_id, when)
    return int(_put_script[0](keys=keys, args=args, client=client))


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
        """Record the message as unacked (and who holds it) and drop its ledger entry,
        in one transaction."""
        delivery = message.delivery_info
        with self.pipe_or_acquire() as pipe:
            pipe.zadd(self.unacked_index_key, {delivery_tag: time.time()}) \
                .hset(self.unacked_key, delivery_tag,
                      dumps([message._raw, delivery["exchange"], delivery["routing_key"]])) \
                .hdel(LEDGER_KEY, delivery_tag)
            if _holder:
                pipe.hset(HOLDERS_KEY, delivery_tag, _holder[0])
            pipe.execute()
            super(kombu_redis.QoS, self).append(message, delivery_tag)  # kombu's bookkeeping

    def _remove_from_indices(self, delivery_tag: str, pipe: Any = None) -> Any:
        """kombu's unacked records of ``delivery_tag``, and its holder, dropped (a restore,
        and beat's put-backs): one copy's records only, a copy put back gets a new tag."""
        return super()._remove_from_indices(delivery_tag, pipe).hdel(HOLDERS_KEY, delivery_tag)

    def ack(self, delivery_tag: str) -> None:
        """Drop the message's records, fenced: only if this process still holds it (an
        AOF that lost its last second can hand the same tag to another worker)."""
        self._drop_if_mine(delivery_tag)
        super(kombu_redis.QoS, self).ack(delivery_tag)

    def reject(self, delivery_tag: str, requeue: bool = False) -> None:
        if requeue:
            return super().reject(delivery_tag, requeue)
        self._drop_if_mine(delivery_tag)
        super(kombu_redis.QoS, self).ack(delivery_tag)

    def _drop_if_mine(self, delivery_tag: str) -> None:
        with self.channel.conn_or_acquire() as client:
            if not _drop_script:
                _drop_script.append(client.register_script(_DROP_IF_MINE))
            _drop_script[0](keys=[HOLDERS_KEY, self.unacked_key, self.unacked_index_key],
                            args=[delivery_tag, _holder[0] if _holder else ""], client=client)


class LedgerChannel(kombu_redis.Channel):
    QoS = LedgerQoS

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        if self.global_keyprefix:  # kombu would prefix only the first key of our scripts
            raise ValueError("gpulanes' transport does not support kombu's global_keyprefix; "
                             "give each cluster its own Redis database instead")

    def _connparams(self, asynchronous: bool = False) -> dict[str, Any]:
        params = super()._connparams(asynchronous)
        if not asynchronous:  # commands (not BRPOP/LISTEN): survive one broken connection
            params["retry"] = ONE_RECONNECT
        return params

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
            keys, args = _put_call(key, lane, payload, tag, "", Conditions())
            batch.add("eval", _PUT, len(keys), *keys, *args)
            return
        when, outcome = _conditions.get()
        with self.conn_or_acquire() as client:
            verdict = _put(client, lane, key, payload, tag,
                           (message.get("headers") or {}).get("id") or "", when)
        if verdict == 0:
            outcome.refusal = LaneAtLimit(lane, when.limit)
        elif verdict < 0:
            outcome.refusal = PublishRefused(_REFUSALS[verdict])

    def _do_restore_message(self, payload: dict, exchange: str, routing_key: str,
                            pipe: Any, leftmost: bool = False) -> None:
        """kombu's restore under a new delivery tag, written to the ledger in the same
        transaction: the copy that was taken keeps its tag, and with it only its own
        records. A lapsed lease of the job is marked released in the same step: the run
        that let it lapse (frozen, cut off) cannot take it again, the put-back copy can."""
        try:
            payload["properties"]["delivery_tag"] = tag = str(uuid.uuid4())
        except (KeyError, TypeError):  # not an envelope: kombu logs what it cannot restore
            return super()._do_restore_message(payload, exchange, routing_key, pipe, leftmost)
        super()._do_restore_message(payload, exchange, routing_key, pipe, leftmost)
        try:
            for queue in filter(_is_lane, self._lookup(exchange, routing_key)):
                key = self._q_for_pri(queue, self._get_message_priority(payload, reverse=False))
                pipe.hset(LEDGER_KEY, tag, ledger_entry(key, dumps(payload))) \
                    .sadd(lists_key(lane_of(queue)), key)
            if job_id := _job_id(payload):  # a lapsed lease can no longer be taken again
                pipe.set(lease_key(job_id), f"{RELEASED}put-back", nx=True,
                         ex=cfg.RUNS_KEPT_S)
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
    a lease taken again meanwhile, stays as it is.
    """
    qos = channel.qos

    def move(pipe: redis.client.Pipeline) -> bool:
        if _text(pipe.hget(HOLDERS_KEY, tag)) != holder:
            return False
        raw = pipe.hget(qos.unacked_key, tag)
        message, exchange, routing_key = loads(raw) if raw else (None, None, None)
        job_id = _job_id(message)
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

    return client.transaction(move, HOLDERS_KEY, qos.unacked_key, value_from_callable=True)


def _job_id(message: Any) -> str:
    headers = message.get("headers") if isinstance(message, dict) else None
    job_id = headers.get("id") if isinstance(headers, dict) else None
    return job_id if isinstance(job_id, str) else ""


def _text(value: bytes | str | None) -> str | None:
    return value.decode() if isinstance(value, bytes) else value


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
