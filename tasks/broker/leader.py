"""Beat's leader lease and fencing token: any number of beats run, one leads.

A beat leads while it holds ``BEAT_LEADER_KEY``, a key that lapses unless renewed
(``lua/lead.lua``). Each new lead increments ``BEAT_EPOCH_KEY``: the epoch is the
leader's fencing token. Every write of beat's (the snapshot and worker record, moves,
put-backs, dead-letter expiry) checks in the same
atomic step that the epoch it was made under is still the current one
(``lua/fence.lua``), so an old leader that was paused or cut off past its lease, and
wakes up after a standby took over, changes nothing.

The epoch a write is made under travels in a context variable that beat sets around
each round (:func:`fenced`); a write made outside one (a worker's, the CLI's) is not
fenced, but beat's own writes refuse to run outside one (:func:`leading`, and the
scripts only beat runs).
"""
from __future__ import annotations

import logging
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Iterator

import redis

from tasks.broker import scripts
from tasks.broker.keys import BEAT_EPOCH_KEY, BEAT_LEADER_KEY

log = logging.getLogger(__name__)
#: What a round of beat's run outside a leader's epoch returns, having written nothing.
NOT_LEADING = "not run under a leading beat's epoch: nothing written"
_epoch: ContextVar[str] = ContextVar("gpulanes_beat_epoch", default="")


def lead(client: redis.Redis, identity: str, lease_s: float,
         floor: int = 0) -> tuple[int, int]:
    """Take or renew the lead for ``lease_s``: (the epoch led, 0 if another beat leads;
    the current epoch). ``floor``: the highest epoch the caller has seen; a new lead's
    epoch is above it and above the epoch key's, so it never goes back, even if that
    key was lost."""
    led, current = scripts.run(client, "lead", [BEAT_LEADER_KEY, BEAT_EPOCH_KEY],
                               [identity, max(1, int(lease_s * 1000)), int(floor)],
                               wait_s=lease_s / 4)  # a renewal is due this often
    return int(led), int(current)


def step_down(client: redis.Redis, identity: str) -> bool:
    """Give the lead up now (a standby takes over at once), if it is still ours."""
    return bool(scripts.run(client, "step_down", [BEAT_LEADER_KEY], [identity]))


def current(client: redis.Redis) -> tuple[str | None, int]:
    """(the leading beat's identity or None, the current epoch)."""
    holder, epoch = client.mget(BEAT_LEADER_KEY, BEAT_EPOCH_KEY)
    text = holder.decode() if isinstance(holder, bytes) else holder
    return text, int(epoch or 0)


@contextmanager
def fenced(epoch: int) -> Iterator[None]:
    """Beat's writes in this block hold only while ``epoch`` is the current one."""
    token = _epoch.set(str(epoch))
    try:
        yield
    finally:
        _epoch.reset(token)


def epoch() -> str:
    """The epoch the writes under way are fenced by ('' : not beat's, unfenced)."""
    return _epoch.get()


def leading(what: str) -> bool:
    """Whether beat's ``what`` may write: only under a leader's epoch (:func:`fenced`).
    Outside one (beat's code run elsewhere, a control task sent to a worker) it is
    refused, and logged: shared scripts let an empty epoch through for workers."""
    if _epoch.get():
        return True
    log.error("%s refused: it runs only in the leading beat, under its epoch; "
              "nothing written", what)
    return False
