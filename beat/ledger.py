"""Republish jobs a worker took from a lane and lost before it could record them.

``tasks.transport`` keeps a ledger of every message published and not yet
recorded as taken. A message in the ledger that is in no list, not unacked
and whose job has not finished was popped by a worker that died (or shut
down) before recording it: beat puts it back at the front of its list. A pop
in progress looks the same for a moment, so a message is put back only when
it is still missing ``grace_s`` later, and the script that puts it back
checks again that it is neither taken nor already back. A false alarm costs
one extra copy of a message, which the job's lease and first-result rule
turn into a no-op; a missed one would cost a job.

Each round compares the ledger's size with what the lists hold (one
transaction); the full comparison (every list read once) runs only when the
ledger holds more than the lists, or every ``AUDIT_S``.
"""
from __future__ import annotations

import json
import logging
import time
from functools import lru_cache
from typing import Any

import redis

from routing.names import (LEDGER_KEY, LEDGER_SUSPECTS_KEY, LISTS_KEY, METRICS_KEY, done_key,
                           metric_field)
from tasks.transport import parse_entry

log = logging.getLogger(__name__)
#: Seconds between full comparisons when the sizes agree.
AUDIT_S = 60.0
#: The ``METRICS_KEY`` field counting messages put back (``gpulanes_recovered_total``).
RECOVERED_FIELD = metric_field("recovered")
#: kombu's hash of unacked messages (delivery tag -> message).
UNACKED_KEY = "unacked"

# KEYS: ledger, unacked. ARGV: tag. Put a lost message back, at the front of its list.
_REPUBLISH = """
local entry = redis.call('HGET', KEYS[1], ARGV[1])
if not entry or redis.call('HEXISTS', KEYS[2], ARGV[1]) == 1 then return 0 end
local cut = string.find(entry, '\\n', 1, true)
local key, message = string.sub(entry, 1, cut - 1), string.sub(entry, cut + 1)
if redis.call('LPOS', key, message) then return 0 end
redis.call('RPUSH', key, message)
return 1
"""


@lru_cache(maxsize=4)
def _republisher(client: redis.Redis) -> Any:
    return client.register_script(_REPUBLISH)


def _sizes(client: redis.Redis) -> tuple[int, int]:
    """(ledger entries, messages held in every list), read in one transaction."""
    keys = list(client.smembers(LISTS_KEY))
    with client.pipeline() as pipe:
        pipe.hlen(LEDGER_KEY)
        for key in keys:
            pipe.llen(key)
        ledger, *held = pipe.execute()
    return ledger, sum(held)


def missing(client: redis.Redis) -> set[str]:
    """Delivery tags in the ledger but in no list, as of one consistent moment."""
    keys = list(client.smembers(LISTS_KEY))
    with client.pipeline() as pipe:  # MULTI: the ledger and the lists at one instant
        pipe.hkeys(LEDGER_KEY)
        for key in keys:
            pipe.lrange(key, 0, -1)
        tags, *lists = pipe.execute()
    present = {_tag(raw) for raws in lists for raw in raws}
    return {_text(tag) for tag in tags} - present


def _tag(raw: bytes | str) -> str | None:
    try:
        return json.loads(raw)["properties"]["delivery_tag"]
    except (ValueError, KeyError, TypeError):
        return None


def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value


def _settled(client: redis.Redis, tag: str) -> bool:
    """True (and its entry dropped) when the message was taken or its job finished."""
    entry = client.hget(LEDGER_KEY, tag)
    if entry is None:
        return True
    job_id = json.loads(parse_entry(entry)[1]).get("headers", {}).get("id", "")
    if client.hexists(UNACKED_KEY, tag) or (job_id and client.exists(done_key(job_id))):
        client.hdel(LEDGER_KEY, tag)
        return True
    return False


_audited_at = [0.0]


def recover_lost(client: redis.Redis, grace_s: float, now: float | None = None,
                 audit: bool | None = None) -> int:
    """One round: note messages gone missing, republish those missing past ``grace_s``.

    ``audit``: compare in full even when the sizes agree (default: every ``AUDIT_S``).
    """
    now = time.time() if now is None else now
    if audit is None:
        audit = time.monotonic() - _audited_at[0] >= AUDIT_S
    if audit:
        _audited_at[0] = time.monotonic()
    ledger, held = _sizes(client)
    if ledger <= held and not audit and not client.exists(LEDGER_SUSPECTS_KEY):
        return 0
    gone = {tag for tag in missing(client) if not _settled(client, tag)}
    seen = {_text(t): float(at) for t, at in client.hgetall(LEDGER_SUSPECTS_KEY).items()}
    client.delete(LEDGER_SUSPECTS_KEY)
    if fresh := {tag: seen.get(tag, now) for tag in gone}:
        client.hset(LEDGER_SUSPECTS_KEY, mapping=fresh)
    due = [tag for tag, at in fresh.items() if now - at >= grace_s]
    put_back = sum(_republisher(client)(keys=[LEDGER_KEY, UNACKED_KEY], args=[tag])
                   for tag in due)
    if put_back:
        client.hincrby(METRICS_KEY, RECOVERED_FIELD, put_back)
        log.warning("%d job(s) taken by a worker that died before recording them: "
                    "put back at the front of their lanes", put_back)
        client.hdel(LEDGER_SUSPECTS_KEY, *due)
    return put_back
