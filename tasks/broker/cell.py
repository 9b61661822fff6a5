"""The cell a context works in (``tasks.broker.cells``): inside :func:`within`, the
clients, snapshot and bindings a publish uses (``redis_client``, ``snapshot_cache``,
``bindings``) are that cell's; outside, this process's own Redis, as with one Redis.

A job's id names its cell (:func:`new_job_id`: a UUID whose last byte is the cell's
number, in the order ``GPULANES_BROKER_URL`` names them).
"""
from __future__ import annotations

import uuid
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Iterator

from tasks.settings import settings

#: The cell this context's Redis calls go to (None: this process's own Redis).
_CELL: ContextVar[str | None] = ContextVar("gpulanes_cell", default=None)


def url_now() -> str:
    """The Redis URL of the cell this context works in, else this process's own (what
    the clients and copies of a Redis are kept by)."""
    name = _CELL.get()
    return settings.broker_url if name is None else settings.cells[name]


@contextmanager
def within(name: str | None) -> Iterator[None]:
    """Redis calls inside the block go to cell ``name`` (None: this process's own)."""
    token = _CELL.set(name)
    try:
        yield
    finally:
        _CELL.reset(token)


def new_job_id(name: str) -> str:
    """A new job id (a UUID) that names cell ``name``: its last byte is the cell's number
    (114 random bits are left: as unlikely to meet another as any UUID)."""
    return f"{str(uuid.uuid4())[:-2]}{list(settings.cells).index(name):02x}"


def named_by(job_id: str) -> str | None:
    """The cell ``job_id`` names (None: no cells, or not one of their ids)."""
    names = list(settings.cells)
    try:
        number = int(job_id[-2:], 16)
    except ValueError:
        return None
    return names[number] if names and number < len(names) else None


def share(seconds: float) -> float:
    """A cell's part of an account's ``seconds`` of fast time, as the account starts (or
    a plan's period renews it): the whole with one Redis, an equal part with cells;
    beat moves the parts where they are spent (``beat.fastsplit``)."""
    return seconds / max(1, len(settings.cells))
