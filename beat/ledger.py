"""Republish jobs a worker took from a lane and lost before it could record them.

``tasks.broker.transport`` keeps a ledger of every message published and not yet
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

import logging
import time
import uuid
from typing import Any

import redis

from routing.names import LANES
from tasks.broker import envelope, leader, scripts
from tasks.broker.keys import (
    BEAT_EPOCH_KEY,
    DUE_PREFIX,
    LANE_DEPTHS_KEY,
    LEDGER_BOOK,
    LEDGER_KEY,
    LIST_DEPTHS_KEY,
    LEDGER_SUSPECTS_KEY,
    METRICS_KEY,
    UNACKED_KEY,
    done_key,
    lane_of_key,
    lists_key,
    metric_field,
    parse_entry,
)

log = logging.getLogger(__name__)
#: Seconds between full comparisons when the sizes agree.
AUDIT_S = 60.0
#: Messages put back per round at most (a burst of losses takes a few rounds).
MAX_PUT_BACK = 100
#: The ``METRICS_KEY`` field counting messages put back (``gpulanes_recovered_total``).
RECOVERED_FIELD = metric_field("recovered")

#: The sets of every lane's lists.
LANE_LISTS = [lists_key(lane) for lane in LANES]


def _lists(client: redis.Redis) -> list[bytes]:
    """Every list key jobs were ever pushed to, in any lane."""
    return list(client.sunion(LANE_LISTS))


def _at_one_moment(client: redis.Redis) -> tuple[dict, list[list], dict, dict]:
    """The ledger, every lane list and both depth counters, in one transaction; read
    again when a list joined the lanes' sets meanwhile (one that left was empty)."""
    keys = _lists(client)
    for _ in range(3):
        with client.pipeline() as pipe:  # MULTI: the ledger and the lists at one instant
            pipe.sunion(LANE_LISTS).hgetall(LEDGER_KEY)
            pipe.hgetall(LANE_DEPTHS_KEY).hgetall(LIST_DEPTHS_KEY)
            for key in keys:
                pipe.lrange(key, 0, -1)
            now_keys, ledger, lanes, lists, *held = pipe.execute()
        if set(now_keys) <= set(keys):
            break
        keys = list(now_keys)
    return ledger, held, lanes, lists


def _sizes(client: redis.Redis) -> tuple[int, int]:
    """(ledger entries, messages held in the lists that hold jobs), in one step."""
    ledger, held = scripts.run(client, "ledger_sizes", [LEDGER_KEY, LIST_DEPTHS_KEY], [])
    return int(ledger), int(held)


def missing(client: redis.Redis) -> set[str]:
    """Delivery tags in the ledger but in no list, as of one consistent moment; the
    depth counters are corrected from the same read (``correct_depths``)."""
    ledger, held, lanes, lists = _at_one_moment(client)
    correct_depths(client, ledger, lanes, lists)
    present = {envelope.tag_of(raw) for raws in held for raw in raws}
    return {_text(tag) for tag in ledger} - present


def correct_depths(client: redis.Redis, ledger: dict, lanes: dict, lists: dict) -> int:
    """Make the depth counters what the ledger holds (``ledger``, ``lanes``, ``lists``:
    read at one moment), as deltas that keep every change made since; how many counts
    were wrong (logged: the scripts keep them exact, short of a Redis that lost writes)."""
    truth: dict[str, int] = {}
    for entry in ledger.values():
        key = parse_entry(entry)[0]
        truth[key] = truth.get(key, 0) + 1
    by_lane: dict[str, int] = {}
    for key, count in truth.items():
        by_lane[lane_of_key(key)] = by_lane.get(lane_of_key(key), 0) + count
    fixes = [*_deltas(by_lane, lanes, ""), *_deltas(truth, lists, "~")]
    if fixes:
        log.warning("lane depth counters corrected from the ledger: %s", fixes[::2])
        scripts.run(client, "depths_fix", [*LEDGER_BOOK[1:], BEAT_EPOCH_KEY],
                    [leader.epoch(), *fixes])
    return len(fixes) // 2


def _deltas(truth: dict[str, int], counted: dict, mark: str) -> list:
    """(mark + field, correction) pairs, flattened, where ``counted`` is not ``truth``."""
    counts = {_text(field): int(n) for field, n in counted.items()}
    return [item for field in sorted(truth.keys() | counts.keys())
            if (delta := truth.get(field, 0) - counts.get(field, 0))
            for item in (mark + field, delta)]


def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value


def drop_entries(client: redis.Redis, *tags: str) -> int:
    """Drop ledger entries (and their depths and due index), fenced by beat's epoch."""
    return int(scripts.run(client, "ledger_drop", [*LEDGER_BOOK, BEAT_EPOCH_KEY],
                           [DUE_PREFIX, leader.epoch(), *tags]))


def _settled(client: redis.Redis, tag: str, unacked_key: str) -> bool:
    """True (and its entry dropped) when the message was taken or its job finished."""
    entry = client.hget(LEDGER_KEY, tag)
    if entry is None:
        return True
    job_id = envelope.job_id(envelope.decode(parse_entry(entry)[1]))
    if client.hexists(unacked_key, tag) or (job_id and client.exists(done_key(job_id))):
        drop_entries(client, tag)
        return True
    return False


def put_back(client: redis.Redis, tag: str, unacked_key: str) -> bool:
    """Republish the lost message ``tag`` under a new delivery tag; False if not lost."""
    entry = client.hget(LEDGER_KEY, tag)
    if entry is None:
        return False
    key, payload = parse_entry(entry)
    new_tag = str(uuid.uuid4())
    fresh = envelope.encode(envelope.with_tag(envelope.decode(payload), new_tag))
    lane_lists = lists_key(lane_of_key(key))
    return bool(scripts.run(client, "ledger_republish",
                            [LEDGER_KEY, unacked_key, lane_lists, LANE_DEPTHS_KEY,
                             LIST_DEPTHS_KEY, BEAT_EPOCH_KEY],
                            [tag, entry, new_tag, fresh, DUE_PREFIX, leader.epoch()]))


def forget_empty_lists(client: redis.Redis) -> int:
    """Drop the empty lists from every lane's set (worker queues of workers long gone,
    unused priority levels); how many were dropped."""
    return sum(scripts.run(client, "ledger_forget_empty", [key, BEAT_EPOCH_KEY],
                           [leader.epoch()]) for key in LANE_LISTS)


class _Rounds:
    """What one beat process remembers between rounds."""

    audited_at = 0.0
    mismatched = False


def _should_compare(client: redis.Redis, audit: bool | None) -> bool:
    """In full only if the sizes differ two rounds running, suspects wait, or it is time."""
    ledger, held = _sizes(client)
    mismatched, _Rounds.mismatched = _Rounds.mismatched, ledger > held  # a take in flight
    if audit is None:  # shows for one round at most; a loss stays
        audit = time.monotonic() - _Rounds.audited_at >= AUDIT_S
    if audit:
        _Rounds.audited_at = time.monotonic()
        forget_empty_lists(client)  # a minute's housekeeping, done with the audit
    return audit or (mismatched and _Rounds.mismatched) or bool(
        client.exists(LEDGER_SUSPECTS_KEY))


def recover_lost(client: redis.Redis, grace_s: float, now: float | None = None,
                 audit: bool | None = None, unacked_key: str = UNACKED_KEY) -> int:
    """One round: note messages gone missing, put back those missing past ``grace_s``.

    ``audit``: compare in full even when the sizes agree (default: every ``AUDIT_S``).
    Only under a leader's epoch: anywhere else it reads and writes nothing.
    """
    if not leader.leading("the ledger audit"):
        return 0
    now = time.time() if now is None else now
    if not _should_compare(client, audit):
        return 0
    gone = {tag for tag in missing(client) if not _checked(_settled, client, tag, unacked_key)}
    seen = {_text(t): float(at) for t, at in client.hgetall(LEDGER_SUSPECTS_KEY).items()}
    client.delete(LEDGER_SUSPECTS_KEY)
    if fresh := {tag: seen.get(tag, now) for tag in gone}:
        client.hset(LEDGER_SUSPECTS_KEY, mapping=fresh)
    due = [tag for tag, at in fresh.items() if now - at >= grace_s][:MAX_PUT_BACK]
    done = sum(bool(_checked(put_back, client, tag, unacked_key)) for tag in due)
    if due:
        client.hdel(LEDGER_SUSPECTS_KEY, *due)
    if done:
        client.hincrby(METRICS_KEY, RECOVERED_FIELD, done)
        log.warning("%d job(s) taken by a worker that died before recording them: "
                    "put back at the front of their lanes", done)
    return done


def _checked(step: Any, client: redis.Redis, tag: str, unacked_key: str) -> bool:
    """``step`` for one tag; a malformed entry is dropped and logged, not fatal to the round
    (it then counts as settled, and as not put back)."""
    try:
        return step(client, tag, unacked_key)
    except (ValueError, KeyError, TypeError, AttributeError) as exc:
        log.error("ledger entry %s is malformed (%s): dropped", tag, exc)
        drop_entries(client, tag)
        return step is _settled
