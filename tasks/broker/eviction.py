"""Refuse a Redis that may evict keys: lanes, results, leases and beat's epoch live there.

An evicting ``maxmemory-policy`` drops whatever it picks when Redis is full, with no
error to anyone: queued jobs, stored results, kombu's bindings, beat's epoch. The
``volatile-*`` policies are no safer: leases and results carry TTLs. Workers, beat and
``lanes up`` call :func:`check_no_eviction` as they start and refuse to run on such a
Redis; ``noeviction`` makes a full Redis refuse writes instead, which gpulanes surfaces.
"""
from __future__ import annotations

import logging
import time
from typing import Callable

import redis

from tasks.errors import ConfigError

log = logging.getLogger(__name__)
#: The one policy under which Redis never deletes a key on its own.
SAFE_POLICY = "noeviction"
#: The Redis setting checked, as ``ConfigError.variable``.
SETTING = "maxmemory-policy"
#: Seconds between tries while Redis does not answer at start (doubling up to this).
WAIT_MAX_S = 10.0


def eviction_policy(client: redis.Redis) -> str:
    """Redis' ``maxmemory-policy``: from ``CONFIG GET``, or from ``INFO memory`` where
    ``CONFIG`` is disabled or renamed (managed Redis answers it with an error)."""
    try:
        found = client.config_get(SETTING)
    except redis.ResponseError:
        found = {}
    policy = found.get(SETTING) if isinstance(found, dict) else None
    if policy is None:
        policy = client.info("memory").get("maxmemory_policy")
    if policy is None:
        raise ConfigError(SETTING, "Redis reports no maxmemory-policy (neither CONFIG GET "
                          "nor INFO memory); gpulanes needs one it can read: use Redis >= 4 "
                          f"with `{SETTING} {SAFE_POLICY}`")
    return policy.decode() if isinstance(policy, bytes) else str(policy)


def check_no_eviction(client: redis.Redis) -> None:
    """Raise :class:`ConfigError` unless Redis' ``maxmemory-policy`` is ``noeviction``."""
    policy = eviction_policy(client)
    if policy != SAFE_POLICY:
        raise ConfigError(SETTING, f"Redis evicts keys under memory pressure ({SETTING} is "
                          f"{policy!r}): queued jobs, results, leases and beat's epoch "
                          f"would be lost without a trace. Set `{SETTING} {SAFE_POLICY}` "
                          f"(redis.conf, or `CONFIG SET {SETTING} {SAFE_POLICY}`; on a "
                          "managed Redis, its parameter group) and start again")


def check_when_answered(client_of: Callable[[], redis.Redis],
                        sleep: Callable[[float], None] = time.sleep) -> None:
    """:func:`check_no_eviction` once Redis answers: a process starting while Redis is
    away waits for it (as it would for its broker) instead of skipping the check."""
    wait_s = 0.5
    while True:
        try:
            return check_no_eviction(client_of())
        except (redis.ConnectionError, redis.TimeoutError, OSError) as exc:
            log.warning("cannot read Redis' %s yet (%s); trying again in %.0fs", SETTING,
                        exc, wait_s)
        sleep(wait_s)
        wait_s = min(WAIT_MAX_S, wait_s * 2)
