"""Moves of queued messages between Redis lists: a job's lane downgrade, its relaxed
level, or a worker's own queue handed back to the shared lane.

A move reads the oldest messages of a list (kombu pops from the right) and moves
each with one Lua script (``lua/move.lua``) that removes it only if it is still
there, so a worker taking it at the same moment is never double-served and
nothing is dropped; the ledger entry and the lane's set of lists follow it, a
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

from routing.names import LANES
from tasks.broker import envelope, scripts
from tasks.broker.keys import LEDGER_KEY, fast_queued_key, lane_of_key, lists_key, run_key
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
        route = self.message.route
        return now - (route.lane_since if route.lane_since is not None
                      else self.message.submitted_at)

    def moved_in(self) -> bool:
        """Moved into its lane out of arrival order (it carries its own clock)."""
        return self.message.route.lane_since is not None

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


def next_to_run(client: redis.Redis | redis.client.Pipeline, key: str, n: int) -> Any:
    """The ``n`` messages of list ``key`` that run next (0: all of them), the very next
    one last (kombu pushes on the left and takes from the right); on a pipeline, queued
    for it."""
    return client.lrange(key, -n, -1)


def move_oldest(client: redis.Redis, source: str, target: str, due: Due,
                leaves_fast: bool = False) -> int:
    """Move each of the oldest messages of ``source`` that ``due`` rewrites.

    ``due`` returns the rewritten envelope, None to leave it, or ``STOP`` when it
    and everything younger are not due yet. Moved messages keep their order at
    the front of ``target``: the oldest is served first. ``leaves_fast``: a moved
    job gives back its account's fast place.
    """
    batch, lane = [], lane_of_key(target)
    for raw in reversed(next_to_run(client, source, MOVES_PER_ROUND)):  # oldest first
        try:
            queued = Queued(raw, envelope.decode(raw))
            rewritten = due(queued)
            account = queued.message.job.account if leaves_fast else None
            job_id, tag = envelope.job_id(queued.envelope), envelope.delivery_tag(queued.envelope)
        except UNREADABLE:
            continue  # not a job message: a worker refuses and dead-letters it
        if rewritten is STOP:
            break
        if rewritten is not None:
            places = [fast_queued_key(account)] if account else []
            batch.append(([source, target, LEDGER_KEY, lists_key(lane), run_key(job_id),
                           *places],
                          [raw, envelope.encode(rewritten), job_id, tag, LANES.index(lane)]))
    return sum(scripts.run(client, "move", keys, args) for keys, args in reversed(batch))


def readdress(client: redis.Redis, source: str, target: str, lane: str) -> int:
    """Move the oldest messages of ``source`` (every one, up to a round's worth) to
    the front of ``target``, addressed to ``lane``; their route is unchanged."""
    return move_oldest(client, source, target,
                       lambda queued: envelope.addressed_to(queued.envelope, lane))
