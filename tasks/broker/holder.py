"""The process that holds what it takes: its identity, the take token of each message
it holds, what it owes Redis, and the messages it settled.

Every message a consumer takes is recorded under its holder in the same step
(``tasks.broker.handover``). A worker names itself by its incarnation
("host/pid/start", ``set_holder``); any other process is named the same way by default.
"""
from __future__ import annotations

import logging
import os
import socket
import threading
import time

import redis

from tasks.broker import handover
from tasks.broker.outage import OUTAGE

log = logging.getLogger(__name__)

#: This process's default name: the same shape as a worker's incarnation.
_PROCESS = f"{socket.gethostname()}/{os.getpid()}/{time.time():.3f}"
#: The identity a worker set for itself, if any.
_holder: list[str] = []


def set_holder(identity: str) -> None:
    """Name the worker process that consumes here ('' : the process's default name)."""
    _holder[:] = [identity] if identity else []


def holder() -> str:
    """The holder this process's takes are recorded under."""
    return _holder[0] if _holder else _PROCESS


class Pending:
    """What this process owes Redis, settled before its next take: the token of a take
    whose answer was lost (repeated), acks and give-backs Redis did not answer. A
    process never keeps a record of a message it does not hold."""

    def __init__(self) -> None:
        self.unanswered = ""
        self.acks: set[str] = set()
        self.returns: set[str] = set()

    def settle(self, client: redis.Redis, holder: str) -> None:
        if self.acks:  # swapped first: pool threads add to it while this runs
            acks, self.acks = self.acks, set()
            try:
                handover.ack(client, holder, *acks)
            except OUTAGE:
                self.acks |= acks
                raise
        for token in list(self.returns):
            handover.put_back(client, holder, token)
            self.returns.discard(token)


PENDING = Pending()
#: Delivery tag -> take token of every message this process holds with a record.
TOKENS: dict[str, str] = {}


def token_of(delivery_tag: str) -> str:
    """The take token (its record's name) of a message held here ('' : none)."""
    return TOKENS.get(delivery_tag, "")


def acked_with_run(delivery_tag: str) -> None:
    """A run's finish dropped the message's record in its own step: the ack has nothing
    left to do in Redis."""
    TOKENS.pop(delivery_tag, None)


def give_back(client: redis.Redis, token: str) -> None:
    """What this process holds under ``token`` back to the front of its list; if Redis
    does not answer, before the next take."""
    try:
        handover.put_back(client, holder(), token)
    except OUTAGE:
        PENDING.returns.add(token)
        log.warning("a message could not be given back (Redis did not answer); it is "
                    "given back before the next take")


def give_back_all_but(client: redis.Redis, running: set[str]) -> int:
    """Give back every message this process holds but those of ``running`` (delivery
    tags): a consumer that lost its connection dropped the rest. How many."""
    gone = [tag for tag in TOKENS if tag not in running]
    for tag in gone:
        give_back(client, TOKENS.pop(tag))
    return len(gone)


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
