"""Celery's Redis result backend, with a run's entries written by its own scripts and
writes that end with a stopping worker.

``submit()`` publishes through the broker's publish (``tasks.broker.publish``), not
Celery's ``send_task``, so nothing subscribes to a job's result before it is published:
``AsyncResult.get()`` subscribes by itself and reads the stored result first, and the
publish is the only round trip of an unseeded submit.
"""
from __future__ import annotations

import json
from typing import Any, NamedTuple

from celery import states
from celery.backends.redis import RedisBackend, SentinelBackend
from kombu.utils.objects import cached_property
from redis.sentinel import SentinelManagedConnection

from tasks.broker import failover
from tasks.broker.keys import prediction_key
from tasks.broker.outage import refusal_parser, stopping
from tasks.broker.store import app_redis_url, following, result_url

class Entry(NamedTuple):
    """A job's entry in the result backend (its key, and the value as the backend
    encodes it), for a script of the run to write in its own step."""
    key: str
    value: str


#: Jobs whose SUCCESS entry their run's own script stored (``lua/run_finish.lua``):
#: Celery's store after the task returns would only read it back to leave it.
_stored: set[str] = set()


#: The states a prediction's event log tells, by the event each is (``lua/events.lua``).
LOGGED = {states.STARTED: "started", states.SUCCESS: "completed",
          states.FAILURE: "completed", states.REVOKED: "completed"}


class ResultBackend(RedisBackend):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        # a refusal (out of memory, MISCONF) is an outage: retried like a lost connection
        self.connparams["parser_class"] = refusal_parser(self.connparams.get("protocol"))

    def exception_safe_to_retry(self, exc: Exception) -> bool:
        """Celery's rule (a lost connection, and so a refusal), except in a process
        that is stopping: an outage then ends the write, never the shutdown."""
        return not stopping() and super().exception_safe_to_retry(exc)

    def ensure(self, fn: Any, args: Any, **policy: Any) -> Any:
        """Celery's write with its retries, tried once in a process that is stopping."""
        if stopping():
            return fn(*args)
        return super().ensure(fn, args, **policy)

    def _set_with_state(self, key: Any, value: Any, state: str) -> Any:
        """Celery's store of a job's state: a prediction's event logged with it
        (``lua/result_store.lua``) when the state is one it tells; any other state (a
        RETRY) only while no final state is stored (``lua/state_store.lua``)."""
        name, prefix = (v.decode() if isinstance(v, bytes) else str(v)
                        for v in (key, self.task_keyprefix))
        if not name.startswith(prefix):
            return super()._set_with_state(key, value, state)
        if isinstance(value, str) and len(value) > self._MAX_STR_VALUE_SIZE:
            return super()._set_with_state(key, value, state)  # Celery refuses it
        expires = int((self.failure_expires if state == states.FAILURE else self.expires) or 0)
        if state not in LOGGED:
            return self.ensure(self._set_unless_final, (name, value, expires))
        job_id = name[len(prefix):]
        return self.ensure(self._set_logged, (name, value, expires, job_id, state))

    def _set_unless_final(self, key: str, value: Any, expires_s: int) -> Any:
        from tasks.broker import scripts

        return scripts.run(self.client, "state_store", [key], [value, expires_s])

    def _set_logged(self, key: str, value: Any, expires_s: int, job_id: str,
                    state: str) -> Any:
        from tasks.broker import scripts

        return scripts.run(self.client, "result_store", [key, prediction_key(job_id)],
                           [value, expires_s, LOGGED[state], json.dumps({"state": state})])

    def mark_as_done(self, task_id: str, result: Any, request: Any = None,
                     store_result: bool = True, state: str = states.SUCCESS) -> None:
        if task_id in _stored:
            _stored.discard(task_id)
            store_result = False
        super().mark_as_done(task_id, result, request, store_result, state)

    def entry(self, task_id: str, result: Any, state: str, request: Any) -> Entry:
        """The entry Celery's own store would write for ``result`` in ``state``."""
        meta = self._get_result_meta(result=self.encode_result(result, state), state=state,
                                     traceback=None, request=request)
        meta["task_id"] = task_id
        return Entry(self.get_key_for_task(task_id).decode(), self.encode(meta))


def run_entries(app: Any) -> bool:
    """Whether a run's scripts store its STARTED and SUCCESS entries themselves: the
    result backend is gpulanes' own on the broker's Redis (one server, one step)."""
    return (isinstance(app.backend, ResultBackend)
            and app.conf.result_backend == result_url(app_redis_url(app.conf)))


def stored_by_run(task_id: str) -> None:
    """The run's script stored ``task_id``'s SUCCESS entry: Celery's store skips it."""
    _stored.add(task_id)


class SentinelResultBackend(ResultBackend, SentinelBackend):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        # a connection whose reply timed out is closed, never reused
        self.connparams["connection_class"] = following(
            self.connparams.get("connection_class", SentinelManagedConnection))

    @cached_property
    def client(self) -> Any:
        """Celery's client, its pool asking the Sentinels for the primary as soon as they
        switch it (``tasks.broker.failover``)."""
        client = SentinelBackend.client.func(self)
        failover.follow(client.connection_pool)
        return client


def store_success(app: Any, job_id: str, result: dict[str, Any]) -> None:
    """Store ``result`` as the success of the new ``job_id`` (a cache hit) in one plain
    SET where the backend is Redis.

    The id is new: there is no earlier state to read first and no one
    subscribed to tell, which is what Celery's own ``store_result`` spends a
    read and a MULTI/PUBLISH transaction on. The entry is the one it writes.
    """
    backend = app.backend
    if not isinstance(backend, RedisBackend):
        backend.store_result(job_id, result, states.SUCCESS)
        return
    meta = {"status": states.SUCCESS, "result": result, "traceback": None, "children": [],
            "date_done": app.now().isoformat(), "task_id": job_id}
    backend.client.set(backend.get_key_for_task(job_id), backend.encode(meta),
                       ex=backend.expires)


#: How long one progress write may take: a report is advisory, a job's steps are not.
PROGRESS_TIMEOUT_S = 0.5
_progress_clients: dict[int, Any] = {}


def store_progress(app: Any, job_id: str, info: dict[str, Any]) -> bool:
    """Store ``info`` as job ``job_id``'s state ``PROGRESS`` unless a final state is
    stored (``lua/progress_store.lua``; its prediction's event log gets it too), on a client of the backend's Redis that gives
    up within ``PROGRESS_TIMEOUT_S``; whether it was written. Not Redis: the backend's
    own store."""
    backend = app.backend
    if not isinstance(backend, RedisBackend):
        backend.store_result(job_id, info, "PROGRESS")
        return True
    meta = {"status": "PROGRESS", "result": info, "traceback": None, "children": [],
            "date_done": None, "task_id": job_id}
    from tasks.broker import scripts

    return bool(scripts.run(_progress_client(backend), "progress_store",
                            [backend.get_key_for_task(job_id), prediction_key(job_id)],
                            [backend.encode(meta), int(backend.expires or 86400),
                             json.dumps(info)]))


def _progress_client(backend: RedisBackend) -> Any:
    """A client of the backend's own connection settings with short timeouts, one per
    backend."""
    client = _progress_clients.get(id(backend))
    if client is None:
        import redis

        pool = backend.client.connection_pool
        kwargs = {**pool.connection_kwargs, "socket_timeout": PROGRESS_TIMEOUT_S,
                  "socket_connect_timeout": PROGRESS_TIMEOUT_S, "retry_on_timeout": False}
        client = redis.Redis(connection_pool=redis.ConnectionPool(
            connection_class=pool.connection_class, **kwargs))
        _progress_clients[id(backend)] = client
    return client
