"""Every Lua script gpulanes runs, read from ``tasks/broker/lua/<name>.lua``.

Each file starts with its KEYS/ARGV header; a line ``-- include: <name>`` takes in
a shared function (``holds``, ``add_fast``). A script's SHA is computed once per
process; it is sent with EVALSHA on whichever client or pipeline runs it, and
loaded on a Redis that does not know it yet (redis-py's ``Script``). Nothing of
a setting is written into a script's source: settings travel as ARGV.

The scripts whose writes a caller acts on (:data:`REPLICATED`: a job accepted, a run
begun or settled, beat's lead) are confirmed by ``GPULANES_REDIS_REPLICAS`` replicas
when it is set: Redis replicates asynchronously, so a primary that dies, or freezes
and is replaced, would otherwise take with it what it said it wrote. Such a script
runs in one pipeline with a write of its own and ``WAIT``, on one connection; fewer
replicas than asked within ``redis_replica_wait_s`` (a third of the Redis timeout) raise
:class:`NotReplicated`, an outage: the caller was told nothing was done, and tries
again (each script answers a retry as the call it repeats). So does a write the
Sentinels may yet drop (``tasks.broker.failover``): one on a primary that froze, was
replaced and woke up while a replica still followed it.
"""
from __future__ import annotations

import re
import threading
from functools import lru_cache
from pathlib import Path
from typing import Any, Sequence

import redis
from redis.client import Pipeline
from redis.commands.core import Script
from redis.sentinel import SentinelConnectionPool

from tasks.broker import failover
from tasks.broker.keys import REPLICATED_KEY
from tasks.broker.outage import RedisRefused
from tasks.settings import settings

LUA_DIR = Path(__file__).with_name("lua")
_INCLUDE = re.compile(r"^-- include: (\w+)$", re.M)
_lock = threading.Lock()
_scripts: dict[str, Script] = {}


@lru_cache(maxsize=None)
def source(name: str) -> str:
    """The text of script ``name``, its includes expanded."""
    text = (LUA_DIR / f"{name}.lua").read_text()
    return _INCLUDE.sub(lambda found: source(found.group(1)).rstrip("\n"), text)


def script(name: str) -> Script:
    """Script ``name``, made once per process (its SHA with it)."""
    with _lock:
        if name not in _scripts:
            _scripts[name] = Script(None, source(name).encode())  # bytes: no encoder needed
        return _scripts[name]


#: The scripts a replica must confirm when ``GPULANES_REDIS_REPLICAS`` asks for it.
REPLICATED = frozenset({"publish", "copy", "run_begin", "run_finish", "run_give_up", "lead"})


class NotReplicated(RedisRefused):
    """Fewer replicas than ``GPULANES_REDIS_REPLICAS`` confirmed a write in time, or the
    Sentinels were replacing the primary that took it: the caller is told it did not
    happen (it may still surface if the primary lives on)."""

    def __init__(self, why: str) -> None:
        super().__init__(f"NOREPLICAS {why}", "NOREPLICAS")


def run(client: Any, name: str, keys: Sequence[Any], args: Sequence[Any],
        wait_s: float | None = None) -> Any:
    """Run script ``name`` on ``client`` (a client or a pipeline); a script of
    :data:`REPLICATED` run on a client waits for its replicas, if the settings ask, at
    most ``wait_s`` (``redis_replica_wait_s``, and never longer)."""
    if settings.redis_replicas and name in REPLICATED and not isinstance(client, Pipeline):
        limit_s = settings.redis_replica_wait_s
        return replicated(client, name, keys, args, settings.redis_replicas,
                          limit_s if wait_s is None else min(wait_s, limit_s))
    return script(name)(keys=keys, args=args, client=client)


def replicated(client: redis.Redis, name: str, keys: Sequence[Any], args: Sequence[Any],
               replicas: int, wait_s: float) -> Any:
    """Script ``name``'s answer once ``replicas`` replicas hold what it wrote, and what
    any earlier call wrote: a write of its own follows it on the same connection, so
    the ``WAIT`` covers a retry that found its work done and wrote nothing itself."""
    found = script(name)
    answer, marked, acked = _waited(client, found.sha, keys, args, replicas, wait_s)
    if isinstance(answer, redis.exceptions.NoScriptError):  # a Redis that never ran it
        client.script_load(found.script)
        answer, marked, acked = _waited(client, found.sha, keys, args, replicas, wait_s)
    for outcome in (answer, marked, acked):
        if isinstance(outcome, Exception):
            raise outcome
    if acked < replicas:
        _rediscover(client)
        raise NotReplicated(f"{acked} of the {replicas} replicas GPULANES_REDIS_REPLICAS "
                            f"asks for confirmed the write within {wait_s:g} s "
                            "(a third of GPULANES_REDIS_TIMEOUT_S)")
    if not failover.stands(client.connection_pool):
        _rediscover(client)
        raise NotReplicated("the Sentinels are replacing the primary that took the write "
                            "(or do not all name it): not counted")
    return answer


def _waited(client: redis.Redis, sha: str, keys: Sequence[Any], args: Sequence[Any],
            replicas: int, wait_s: float) -> list[Any]:
    """[the script's answer, the mark's, the replicas that hold both]: one round trip."""
    with client.pipeline(transaction=False) as pipe:
        pipe.evalsha(sha, len(keys), *keys, *args)
        pipe.set(REPLICATED_KEY, "1")
        pipe.wait(replicas, max(1, int(wait_s * 1000)))
        return pipe.execute(raise_on_error=False)


def _rediscover(client: redis.Redis) -> None:
    """Drop the idle connections of a Sentinel-managed ``client``: the next asks the
    Sentinels again (this primary may have been replaced while frozen)."""
    if isinstance(client.connection_pool, SentinelConnectionPool):
        client.connection_pool.disconnect(inuse_connections=False)
