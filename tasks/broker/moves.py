"""Moves of queued messages between Redis lists: a job's lane downgrade, its relaxed
level, or a worker's own queue handed back to the shared lane.

A move reads the oldest messages of a list (kombu pops from the right) and moves
each with one Lua script (``lua/move.lua``) that removes it only if it is still
there, so a worker taking it at the same moment is never double-served and
nothing is dropped; its count, due index entry and the lane's set of lists follow it, a
coalesced run the job leads takes the target lane's rank, and a job leaving the
fast lane gives back its account's fast place, all in that step. What is due
to move, and where, is the caller's policy (``beat.movers``, ``beat.shared``).
"""
from __future__ import annotations

import binascii
from dataclasses import dataclass
from functools import cached_property
from typing import Any, Callable

import redis

from routing.names import FAIR_LANES, FAST, LANES
from tasks.broker import envelope, leader, scripts
from tasks.broker.keys import (
    BEAT_EPOCH_KEY,
    DUE_PREFIX,
    FAST_NEWS_PREFIX,
    LANE_DEPTHS_KEY,
    LIST_DEPTHS_KEY,
    PREEMPTIBLE_KEY,
    PRIORITY_SEP,
    WAKE_PREFIX,
    due_clock,
    due_key,
    lane_of_key,
    lists_key,
    parse_entry,
    queued_key,
    waiting_accounts_key,
    run_key,
)
from tasks.broker.message import JobMessage

#: Oldest messages looked at per list per round: a round must stay short.
MOVES_PER_ROUND = 200
#: Returned by a ``due`` function: this message and all younger ones stay.
STOP: dict = {}
#: What is wrong with a list item that is not a job message (a worker refuses it).
UNREADABLE = (ValueError, KeyError, TypeError, IndexError, binascii.Error)


@dataclass(frozen=True)
class Queued:
    """A message waiting in a list; its job message is decoded once, when asked for."""

    raw: bytes | str
    envelope: dict

    @cached_property
    def _call(self) -> tuple[list, JobMessage, dict]:
        args, kwargs, embed = envelope.call(self.envelope)
        return args, JobMessage.decode(kwargs), embed

    @property
    def message(self) -> JobMessage:
        return self._call[1]

    def waited_s(self, now: float) -> float:
        """How long it has waited in its lane (since it entered it, or was submitted)."""
        return now - self.message.lane_clock

    def demoted(self, lane: str, reason: str, now: float) -> dict:
        """The same job, addressed to ``lane``, its route saying why and since when."""
        args, message, embed = self._call
        moved = message.with_route(message.route.moved(lane, reason, now))
        return envelope.with_call(envelope.addressed_to(self.envelope, lane), args,
                                  moved.kwargs(), embed)

    def first_in_level(self) -> dict:
        """The same message at the first relaxed level."""
        return envelope.with_properties(self.envelope, priority=0)


Due = Callable[[Queued], "dict | None"]


def lane_clock_of(message: dict) -> float:
    """When the job of a kombu message began its wait in its lane (its due index's
    clock); 0 for a message that is not a job's (never indexed)."""
    try:
        return JobMessage.decode(envelope.call(message)[1]).lane_clock
    except UNREADABLE:
        return 0.0


def next_to_run(client: redis.Redis | redis.client.Pipeline, key: str, n: int) -> Any:
    """The ``n`` messages of list ``key`` that run next (0: all of them), the very next
    one last (kombu pushes on the left and takes from the right); on a pipeline, queued
    for it."""
    return client.lrange(key, -n, -1)


def move_oldest(client: redis.Redis, source: str, target: str, due: Due) -> int:
    """Move each of the oldest messages of ``source`` that ``due`` rewrites (a list read
    from its end: a worker's own queue handed back).

    ``due`` returns the rewritten envelope, None to leave it, or ``STOP`` when it
    and everything younger are not due yet. Moved messages keep their order at
    the front of ``target``: the oldest is served first.
    """
    batch = []
    for raw in reversed(next_to_run(client, source, MOVES_PER_ROUND)):  # oldest first
        call = _move_call(client, source, target, raw, due)
        if call is STOP:
            break
        if call is not None:
            batch.append(call)
    return _run_moves(client, batch)


def move_due(client: redis.Redis, lane: str, cutoff: float, due: Due,
             target_of: Callable[[str], str], back: bool = False) -> int:
    """Move the messages of ``lane`` that entered it before ``cutoff`` (unix s) and that
    ``due`` rewrites, each from its list to ``target_of(its list)``, found from the
    lane's due index (``keys.due_key``), not by reading its lists. A message ``due``
    leaves (None) will never move on its clock (a job that is not downgradable): it
    leaves the index; one it answers ``STOP`` for stays in it. Oldest first, each kept
    in that order at the front of its target (ahead of what is there), or with ``back``
    at its back: moved after the messages earlier rounds moved there, a message keeps
    its place in time.

    An index entry is "<list>\n<message>": a take drops it in its own step.
    """
    entries = client.zrangebyscore(due_key(lane), "-inf", cutoff, start=0, num=MOVES_PER_ROUND)
    batch, left = [], []
    for entry in entries:
        source, raw = parse_entry(entry)
        call = _move_call(client, source, target_of(source), raw, due, back)
        if call is None:
            left.append(entry)
        elif call is not STOP:
            batch.append(call)
    if left:
        client.zrem(due_key(lane), *left)
    return _run_moves(client, batch, back)


def _move_call(client: redis.Redis, source: str, target: str, raw: bytes | str, due: Due,
               back: bool = False) -> tuple[list, list] | dict | None:
    """The KEYS and ARGV of moving one message (``lua/move.lua``) if ``due`` rewrites it;
    None to leave it (and a message that is not a job's), ``STOP`` from ``due``. A job
    that leaves the fast or standard lane leaves its account's queued jobs there (its
    fast place, ``tasks.jobs.fastlimit``)."""
    try:
        queued = Queued(raw, envelope.decode(raw))
        rewritten = due(queued)
        account = queued.message.job.account
        job_id = envelope.job_id(queued.envelope)
    except UNREADABLE:
        return None  # not a job message: a worker refuses and dead-letters it
    if rewritten is STOP or rewritten is None:
        return rewritten
    lane, left = lane_of_key(target), lane_of_key(source)
    leaves = left in FAIR_LANES and left != lane
    places = [queued_key(left, account), waiting_accounts_key(left)] if leaves else []
    clock = due_clock(target, lane_clock_of(rewritten))
    return ([source, target, LANE_DEPTHS_KEY, LIST_DEPTHS_KEY, BEAT_EPOCH_KEY, lists_key(lane),
             run_key(job_id), *places],
            [raw, envelope.encode(rewritten), job_id, WAKE_PREFIX, LANES.index(lane),
             repr(clock), DUE_PREFIX, leader.epoch(), "1" if back else "", account])


def _run_moves(client: redis.Redis, batch: list[tuple[list, list]], back: bool = False) -> int:
    """Run the moves (oldest first in ``batch``) so that they keep that order in their
    target: youngest first to its front, oldest first to its back. One pipelined round
    trip: each move is still its own atomic step, in that order."""
    if not batch:
        return 0
    with client.pipeline(transaction=False) as pipe:
        for keys, args in (batch if back else reversed(batch)):
            scripts.run(pipe, "move", keys, args)
        return sum(pipe.execute())


def hand_over(client: redis.Redis, moves: list[tuple[str, str, bytes | str]]) -> int:
    """Move each ``(source, target, message)`` that is still in its source (a worker
    may have taken it since it was read) to the back of ``target``, another worker's
    own queue of the same lane and step, addressed to it, in the order given; its route
    is unchanged. A fast job moved is told to its new worker (``lua/fast_news.lua``), as
    a publish tells it. One pipelined round trip (two with fast jobs); how many moved."""
    calls = []
    for source, target, raw in moves:
        queue = target.partition(PRIORITY_SEP)[0]
        call = _move_call(client, source, target, raw,
                          lambda queued, q=queue: envelope.addressed_to(queued.envelope, q),
                          back=True)
        if isinstance(call, tuple):
            calls.append((target, call))
    if not calls:
        return 0
    with client.pipeline(transaction=False) as pipe:
        for _, (keys, args) in calls:
            scripts.run(pipe, "move", keys, args)
        done = pipe.execute()
    told = [target for (target, _), moved in zip(calls, done)
            if moved and lane_of_key(target) == FAST]
    if told:
        with client.pipeline(transaction=False) as pipe:
            for target in told:
                scripts.run(pipe, "fast_tell", [PREEMPTIBLE_KEY], [FAST_NEWS_PREFIX, target])
            pipe.execute()
    return sum(1 for moved in done if moved)


def readdress(client: redis.Redis, source: str, target: str, lane: str) -> int:
    """Move the oldest messages of ``source`` (every one, up to a round's worth) to
    the front of ``target``, addressed to ``lane``; their route is unchanged."""
    return move_oldest(client, source, target,
                       lambda queued: envelope.addressed_to(queued.envelope, lane))
