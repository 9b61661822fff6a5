"""Who calls: ``Authorization: Bearer <key>`` names an API key, the key its account and
plan (``tasks.jobs.apikeys``). One :class:`~tasks.jobs.apikeys.KeyCache` per process
keeps the keys it has seen and drops a revoked one as its revocation is announced."""
from __future__ import annotations

import threading

from fastapi import Depends, Request
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from starlette.concurrency import run_in_threadpool

from tasks.front.errors import Refused
from tasks.jobs.apikeys import ApiKey, KeyCache

_bearer = HTTPBearer(auto_error=False, description="An API key: `celery -A tasks lanes "
                     "keys create ACCOUNT` makes one.")
_lock = threading.Lock()
_cache: list[KeyCache] = []
#: What a refused caller is told to send.
CHALLENGE = {"WWW-Authenticate": 'Bearer realm="gpulanes"'}
#: The OpenAPI ``security`` of a route that reads its key itself (:func:`request_key`).
SECURITY = [{_bearer.scheme_name: []}]


def key_cache() -> KeyCache:
    """This process's key cache, made (and its listener started) on first use."""
    with _lock:
        if not _cache:
            from tasks.broker.app import redis_client

            _cache.append(KeyCache(redis_client()))
        return _cache[0]


def close_key_cache() -> None:
    """Stop this process's key cache (the next use makes a new one)."""
    with _lock:
        if _cache:
            _cache.pop().close()


async def caller(credentials: HTTPAuthorizationCredentials | None = Depends(_bearer)
                 ) -> ApiKey:
    """The key the request carries, or 401 (none, unknown or revoked): from memory on
    the event loop, else read from Redis in a thread."""
    if credentials is None or not credentials.credentials:
        raise Refused(401, "no API key: send the header `Authorization: Bearer <key>`",
                      headers=CHALLENGE)
    cache = key_cache() if _cache else await run_in_threadpool(key_cache)
    record = cache.kept(credentials.credentials) or \
        await run_in_threadpool(cache.lookup, credentials.credentials)
    if record is None:
        raise Refused(401, "the API key is unknown or revoked", headers=CHALLENGE)
    return record


async def request_key(request: Request) -> ApiKey:
    """:func:`caller`, for a route that reads its request itself."""
    return await caller(await _bearer(request))
