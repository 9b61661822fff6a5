"""Cells: the pools spread over several Redis instances (``tasks.settings_cells``).

A cell is a whole gpulanes cluster on its own Redis; workers and beat use their own pool's
and never learn of the others. A submitting process knows them all: it reads each
cell's snapshot, and publishes each job to the cell of its model (:func:`cell_of_job`),
inside ``tasks.broker.cell.within`` that cell, in the one round trip a publish always
takes, there. The job's id names its cell, so :func:`result` reads a job's result from
the right Redis however its id reached the reader.
"""
from __future__ import annotations

import hashlib
from functools import lru_cache
from typing import Any, Callable

from celery import Celery
from celery.result import AsyncResult

from tasks.broker.app import app, redis_client
from tasks.broker.cell import named_by, within
from tasks.broker.view import snapshot_cache
from tasks.broker.store import result_url
from tasks.settings import settings


@lru_cache(maxsize=None)
def app_of(name: str) -> Any:
    """A Celery app on cell ``name``'s Redis: its results, its control commands."""
    url = settings.cells[name]
    cell = Celery("gpulanes", set_as_current=False,
                  control="tasks.broker.control:LanesControl")
    cell.config_from_object("celeryconfig")
    cell.conf.update(broker_url=f"gpulanes+{url.split(';')[0]}", result_backend=result_url(url),
                     broker_transport_options={**cell.conf.broker_transport_options,
                                               "url": url})
    return cell


def bound(found: Any, name: str) -> Any:
    """``found`` (what a submit in cell ``name`` answered) read from that cell's Redis: an
    ``AsyncResult`` is bound to the cell's app (a cached result, answered at once, is
    left as it is)."""
    if type(found) is not AsyncResult:
        return found
    return AsyncResult(found.id, app=app_of(name))


def result(job_id: str) -> Any:
    """The ``AsyncResult`` of ``job_id``, on the Redis of the cell its id names."""
    name = named_by(job_id)
    return AsyncResult(job_id, app=app if name is None else app_of(name))


def of_job(job_id: str) -> tuple[Any, Any]:
    """The Celery app and Redis client of the cell ``job_id`` names; with one Redis, or an
    id that names none, this process's own."""
    name = named_by(job_id)
    if name is None:
        return app, redis_client()
    with within(name):
        return app_of(name), redis_client()


def each() -> list[tuple[str | None, Any, Any]]:
    """(cell, its Celery app, its Redis client) of every cell, in the order the broker
    URL names them; with one Redis, (None, this process's own app and client)."""
    if not settings.cells:
        return [(None, app, redis_client())]
    found = []
    for name in settings.cells:
        with within(name):
            found.append((name, app_of(name), redis_client()))
    return found


def cell_of_job(model: str, keyed: bool = False,
                fits: Callable[[Any], bool] = lambda view: True) -> str:
    """The cell a new job of ``model`` goes to. Of the cells whose workers can hold it
    (``fits`` of each cell's members view; all when none can), the first by rendezvous
    hashing on the model where a worker holds it warm, else the first: its jobs keep to
    one cell while it stays warm there, and one cell warms it when none holds it. A job
    with an idempotency key (``keyed``) goes to the first, warm or not, so that the key
    is claimed in the same cell whenever it comes back."""
    caches = _caches(tuple(settings.cells.items()))
    order, first = _order(model, tuple(caches)), None
    for name in order:
        view = caches[name].members()
        if not fits(view):
            continue
        if keyed or view is not None and view.holders.get(model):
            return name
        first = first or name
    return first or order[0]


@lru_cache(maxsize=None)
def _caches(cells: tuple[tuple[str, str], ...]) -> dict[str, Any]:
    """Each cell's snapshot cache (``tasks.broker.view.snapshot_cache``)."""
    found = {}
    for name, _ in cells:
        with within(name):
            found[name] = snapshot_cache()
    return found


@lru_cache(maxsize=4096)
def _order(model: str, names: tuple[str, ...]) -> tuple[str, ...]:
    """``names`` by rendezvous hashing on ``model``, highest first."""
    return tuple(sorted(names, key=lambda name: hashlib.blake2b(
        f"{name}/{model}".encode(), digest_size=8).digest(), reverse=True))
