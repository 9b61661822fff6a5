"""The worker process that consumes here, as the holder of the messages it takes.

kombu's take records which process holds each message (``tasks.broker.transport``),
so beat puts a dead worker's messages back at once. This module keeps that identity,
the tags whose records a run's finish already dropped, and a mark set when a take or
an ack got no answer: Redis may run it once it answers, leaving a record that names
this process as holder of a message it does not hold (``gpu_worker.hooks.KeepHeld``
settles such orphans).
"""
from __future__ import annotations

import threading
from contextlib import contextmanager
from typing import Iterator

#: The identity ("host/pid/start") of the worker process consuming here, if any.
_holder: list[str] = []


#: Delivery tags whose records a run's finish already dropped (``tasks.broker.runs``):
#: their ack has nothing left to do in Redis.
_acked: set[str] = set()


def set_holder(identity: str) -> None:
    """Name the worker process that consumes here: its takes record it as holder
    ('' : none)."""
    _holder[:] = [identity] if identity else []


def holder() -> str:
    """The worker process that consumes here ('' : none)."""
    return _holder[0] if _holder else ""


#: Set when a write about this process's takes or acks got no answer (Redis frozen,
#: cut off): Redis may still run it once it answers, leaving a record that names this
#: process as holder of a message it does not hold (a take it never delivered, an ack
#: that did not drop its records). ``gpu_worker.hooks.KeepHeld`` settles such orphans.
_unanswered = threading.Event()


def unanswered_since(clear: bool = False) -> bool:
    """Whether a take or ack of this process went unanswered since the flag was last
    cleared (``clear``: clear it now, as the caller settles what it left)."""
    seen = _unanswered.is_set()
    if clear and seen:
        _unanswered.clear()
    return seen


def note_unanswered() -> None:
    """Something this process took may be recorded in Redis though it no longer holds it
    (a take unanswered, a connection lost with messages in hand): settle its orphans."""
    _unanswered.set()


@contextmanager
def noting_unanswered() -> Iterator[None]:
    """A block whose Redis write, should it raise, may still run later: note it."""
    try:
        yield
    except BaseException:
        note_unanswered()
        raise


def acked_by_run(tag: str) -> None:
    """The message ``tag``'s records went with its run's finish: its ack only does
    kombu's bookkeeping."""
    _acked.add(tag)


def acked_earlier(tag: str) -> bool:
    """Whether ``tag``'s records went with its run's finish (forgotten as it is asked)."""
    if tag in _acked:
        _acked.discard(tag)
        return True
    return False


#: Delivery tags acked or rejected here, with when (monotonic): what a worker's
#: watchdog compares the runs that ended with (``gpu_worker.stuck``). Pruned as read.
_settled: dict[str, float] = {}
_settled_lock = threading.Lock()


def settled(tag: str, at: float) -> None:
    """The message ``tag`` was acked or rejected here at ``at`` (monotonic), whether or
    not Redis heard of it: this process no longer holds it."""
    with _settled_lock:
        _settled[tag] = at


def was_settled(tag: str, forget_before: float) -> bool:
    """Whether ``tag`` was settled here (forgotten as it is asked); marks older than
    ``forget_before`` (monotonic) are dropped on the way."""
    with _settled_lock:
        for old in [t for t, at in _settled.items() if at < forget_before]:
            del _settled[old]
        return _settled.pop(tag, None) is not None
