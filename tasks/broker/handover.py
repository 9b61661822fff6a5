"""The queue protocol: a message is always in a list or in its holder's records.

- A push adds a message to a list, counts it, indexes it for beat's movers and wakes
  the queue's consumers, in one step (``lua/push.lua``).
- A take (``lua/hand_over.lua``) moves the next message of the first list that holds
  one into the taker's records (``keys.held_key``: take token -> list and message), in
  one step. Redis never holds a message that is in no list and no record.
- An ack drops the record. A give-back returns it to the front of its list, in the step
  that drops the record: a worker's own (a reject, a shutdown), or beat's for a holder
  that died or froze (:func:`put_back_all`), which reads nothing else.
- A take whose answer was lost (a timeout, a cut connection) is repeated with its
  token, and answers the message it took, so a live worker never holds a record of
  a message it never received.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable

import redis

from tasks.broker import envelope, scripts
from tasks.broker.keys import (
    BEAT_EPOCH_KEY,
    DEAD_KEY,
    DUE_PREFIX,
    HOLDING_KEY,
    UNREADABLE_KEY,
    LANE_DEPTHS_KEY,
    LIST_DEPTHS_KEY,
    WAKE_PREFIX,
    done_key,
    due_clock,
    held_key,
    lease_key,
)
from tasks.broker.moves import lane_clock_of

#: The depth counters every script of the protocol keeps, in the order they take them.
DEPTHS = (LANE_DEPTHS_KEY, LIST_DEPTHS_KEY)


@dataclass(frozen=True)
class Taken:
    """A message handed over: the take's token (its record's name), its list, the message."""

    token: str
    key: str
    raw: str


def push(client: redis.Redis, key: str, raw: str, *, front: bool = False,
         entered_at: float = 0.0) -> None:
    """Push ``raw`` to list ``key`` (``front``: taken next); ``entered_at``: when its job
    entered its lane (beat's movers find it by that clock; 0: never moved)."""
    scripts.run(client, "push", [key, *DEPTHS],
                [raw, "1" if front else "", repr(due_clock(key, entered_at)), DUE_PREFIX,
                 WAKE_PREFIX])


def take(client: redis.Redis, holder: str, keys: Iterable[str], token: str, *,
         repeat: bool = False, record: bool = True) -> Taken | None:
    """Hand over the next message of the first of ``keys`` that holds one, recorded as
    ``holder``'s under ``token`` (``record``: False for a consumer that never acks).
    ``repeat``: this take's answer was lost once; it answers what it took then."""
    got = scripts.run(client, "hand_over", [held_key(holder), *DEPTHS, *keys],
                      [token, "1" if repeat else "", "1" if record else "", DUE_PREFIX])
    return Taken(token, _text(got[0]), _text(got[1])) if got else None


def empty(client: redis.Redis, keys: list[str]) -> int:
    """Drop every message of lists ``keys``, their counts and index entries with them;
    how many were dropped."""
    return int(scripts.run(client, "empty", [*DEPTHS, *keys], [DUE_PREFIX]))


def ack(client: redis.Redis, holder: str, *tokens: str) -> None:
    """Drop the records of messages ``holder`` is done with."""
    if tokens:
        client.hdel(held_key(holder), *tokens)


def set_aside(client: redis.Redis, holder: str, taken: Taken, problem: str) -> None:
    """Move an item that is not a message (not JSON, no delivery tag) from ``holder``'s
    records to the unreadable list, where an operator finds it: it blocks no queue."""
    with client.pipeline() as pipe:
        pipe.lpush(UNREADABLE_KEY, f"{taken.key}\n{problem}\n{taken.raw}")
        pipe.hdel(held_key(holder), taken.token)
        pipe.execute()


def register(client: redis.Redis, holder: str) -> None:
    """Name ``holder`` among those that take with records (beat looks for dead ones there)."""
    client.sadd(HOLDING_KEY, holder)


def holders(client: redis.Redis) -> set[str]:
    """Every holder that takes with records."""
    return {_text(who) for who in client.smembers(HOLDING_KEY)}


def held(client: redis.Redis, holder: str) -> dict[str, tuple[str, str]]:
    """What ``holder`` holds: take token -> (list, message)."""
    records = client.hgetall(held_key(holder))
    return {_text(token): _record(record) for token, record in records.items()}


def give_back(client: redis.Redis, holder: str, token: str, *, entered_at: float = 0.0,
              expected: str = "", epoch: str = "", job_id: str = "",
              unless_running: bool = False) -> int:
    """Return what ``holder`` holds under ``token`` to the front of its list, dropping the
    record in the same step: 1 back, 0 not held (or left), -1 its job finished (dropped).

    ``expected``: only if the record is still this one. ``epoch``: beat's, checked in the
    same step. ``job_id``: a job's message, dropped if the job finished or failed for
    good; with ``unless_running``, left while ``holder`` still holds the job's lease (it
    runs it, silent to heartbeats: a warm shutdown)."""
    key = _record(expected)[0] if expected else ""
    keys = [held_key(holder), *DEPTHS, BEAT_EPOCH_KEY if epoch else "",
            lease_key(job_id) if job_id else "", done_key(job_id) if job_id else "",
            DEAD_KEY if job_id else ""]
    return int(scripts.run(client, "give_back", keys,
                           [token, expected, repr(due_clock(key, entered_at) if key else 0.0),
                            DUE_PREFIX, WAKE_PREFIX, epoch,
                            holder if unless_running else "", job_id]))


def put_back_all(client: redis.Redis, holder: str, *, epoch: str = "",
                 unless_running: bool = True) -> int:
    """Give back everything ``holder`` holds (beat, for a holder that died or froze);
    a job that finished is only dropped. How many went back."""
    back = 0
    for token, (key, raw) in held(client, holder).items():
        try:
            message = envelope.decode(raw)
            job_id, entered_at = envelope.job_id(message) or "", lane_clock_of(message)
        except (ValueError, KeyError, TypeError):  # not a job's: back as it is
            job_id, entered_at = "", 0.0
        back += give_back(client, holder, token, expected=f"{key}\n{raw}", epoch=epoch,
                          job_id=job_id, entered_at=entered_at,
                          unless_running=unless_running) == 1
    if not client.exists(held_key(holder)):
        client.srem(HOLDING_KEY, holder)
    return back


def _record(record: str | bytes) -> tuple[str, str]:
    key, _, raw = _text(record).partition("\n")
    return key, raw


def _text(value: str | bytes) -> str:
    return value.decode() if isinstance(value, bytes) else value
