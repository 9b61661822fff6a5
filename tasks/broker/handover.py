"""The queue protocol: a message is always in a list or in its holder's records.

- A push adds a message to a list, counts it, indexes it for beat's movers and wakes
  one idle consumer of its queue, in one step (``lua/push.lua``): a take that finds
  nothing records its taker as idle, one that finds a job drops that record.
- A take (``lua/hand_over.lua``) moves the next message of the first list that holds
  one into the taker's records (``keys.held_key``: take token -> list and message), in
  one step. Redis never holds a message that is in no list and no record.
- An ack drops the record. A give-back returns it to the front of its list, in the step
  that drops the record: a worker's own (a reject, a shutdown), or beat's for a holder
  that died or froze (:func:`put_back_all`), which reads nothing else.
- A take whose answer was lost (a timeout, a cut connection) is sent again with its
  token, and answers the message it took, so a live worker never holds a record of
  a message it never received.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable

import redis

from routing.names import LANES
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
    lane_of_key,
    lease_key,
)
from tasks.broker.moves import lane_clock_of
from tasks.broker.publish import RELEASED
from tasks.settings import settings

#: The depth counters every script of the protocol keeps, in the order they take them.
DEPTHS = (LANE_DEPTHS_KEY, LIST_DEPTHS_KEY)
#: Seconds an idle consumer's record is kept: it records itself again with each idle
#: take (``tasks.broker.lanes.IDLE_TAKE_S``, 5 s), so one older is of a consumer gone.
IDLE_KEPT_S = 30


@dataclass(frozen=True)
class Taken:
    """A message handed over: the take's token (its record's name), its list, the message,
    and whether the lists it was taken from may hold more."""

    token: str
    key: str
    raw: str
    more: bool = True


def push(client: redis.Redis, key: str, raw: str, *, front: bool = False,
         entered_at: float = 0.0) -> None:
    """Push ``raw`` to list ``key`` (``front``: taken next); ``entered_at``: when its job
    entered its lane (beat's movers find it by that clock; 0: never moved)."""
    scripts.run(client, "push", [key, *DEPTHS],
                [raw, "1" if front else "", repr(due_clock(key, entered_at)), DUE_PREFIX,
                 WAKE_PREFIX])


def take(client: redis.Redis, holder: str, keys: Iterable[str], token: str, *,
         record: bool = True, wake: str = "") -> Taken | None:
    """Hand over the next message of the first of ``keys`` that holds one, recorded as
    ``holder``'s under ``token`` (``record``: False for a consumer that never acks). A
    take sent again with its token (its answer was lost) answers what it took then.
    ``wake``: the taker's wake-up channel; found empty, it is recorded as idle on the
    lists' queues, where the next push wakes it (``keys.wake_key``)."""
    keys = list(keys)
    indexed = "".join("1" if due_clock(key, 1.0) and is_lane_list(key) else "0" for key in keys)
    got = scripts.run(client, "hand_over", [held_key(holder), *DEPTHS, HOLDING_KEY, *keys],
                      [token, "1" if record else "", DUE_PREFIX, indexed, holder, wake,
                       WAKE_PREFIX, IDLE_KEPT_S])
    return Taken(token, _text(got[0]), _text(got[1]), bool(got[2])) if got else None


def is_lane_list(key: str) -> bool:
    """Whether list ``key`` holds a lane's jobs (whose messages beat may move)."""
    return lane_of_key(key) in LANES


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


def holders(client: redis.Redis) -> set[str]:
    """Every holder that took with records (named in the take's step), until beat gave
    back all it held."""
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
                            holder if unless_running else "", job_id, RELEASED,
                            settings.runs_kept_s]))


def put_back(client: redis.Redis, holder: str, token: str, record: str | None = None, *,
             epoch: str = "", unless_running: bool = False) -> int:
    """:func:`give_back` of what ``holder`` holds under ``token`` (its ``record`` read here
    if not given), its job id and lane clock read from the message."""
    if record is None:
        record = client.hget(held_key(holder), token)
        if record is None:
            return 0
    record = _text(record)
    try:
        message = envelope.decode(_record(record)[1])
        job_id, entered_at = envelope.job_id(message) or "", lane_clock_of(message)
    except (ValueError, KeyError, TypeError):  # not a job's: back as it is
        job_id, entered_at = "", 0.0
    return give_back(client, holder, token, expected=record, epoch=epoch, job_id=job_id,
                     entered_at=entered_at, unless_running=unless_running)


def put_back_all(client: redis.Redis, holder: str, *, epoch: str = "",
                 unless_running: bool = True) -> int:
    """Give back everything ``holder`` holds (beat, for a holder that died or froze);
    a job that finished is only dropped. How many went back."""
    records = client.hgetall(held_key(holder))
    back = sum(put_back(client, holder, _text(token), record, epoch=epoch,
                        unless_running=unless_running) == 1
               for token, record in records.items())
    scripts.run(client, "forget_holder", [held_key(holder), HOLDING_KEY], [holder])
    return back


def _record(record: str | bytes) -> tuple[str, str]:
    key, _, raw = _text(record).partition("\n")
    return key, raw


def _text(value: str | bytes) -> str:
    return value.decode() if isinstance(value, bytes) else value
