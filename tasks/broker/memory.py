"""What Redis says of itself: how much of its ``maxmemory`` it uses (beat measures it
each round, and submits are refused above :data:`MEMORY_LIMIT` of it, so
the outcomes of the jobs already accepted always find room), and whether it is
refusing writes now (``lanes status`` shows it)."""
from __future__ import annotations

from typing import Any

import redis

MIB = 1 << 20
#: New jobs are refused while Redis uses more than this share of its ``maxmemory`` (as
#: beat last measured it): the rest is kept for the outcomes of accepted jobs.
MEMORY_LIMIT = 0.9


def memory_use(client: redis.Redis) -> dict[str, Any]:
    """``used_mb``, ``max_mb`` (0: no limit), ``memory_share`` (used over max; 0 with no
    limit) and ``policy`` (``maxmemory-policy``, which may have changed since the
    processes started) from ``INFO memory``, one round trip."""
    return _memory(client.info("memory"))


def _memory(info: dict[str, Any]) -> dict[str, Any]:
    used, limit = int(info.get("used_memory", 0)), int(info.get("maxmemory", 0))
    return {"used_mb": round(used / MIB, 1), "max_mb": round(limit / MIB, 1),
            "memory_share": round(used / limit, 4) if limit else 0.0,
            "policy": info.get("maxmemory_policy")}


def redis_state(client: redis.Redis) -> dict[str, Any]:
    """:func:`memory_use`, and ``refusing``: why Redis refuses writes now, as its own
    ``INFO`` says (None: it takes them). One round trip."""
    info = client.info()
    memory = _memory(info)
    reasons = [why for failed, why in (
        (memory["max_mb"] and memory["memory_share"] >= 1, "out of memory (OOM)"),
        (info.get("aof_last_write_status") == "err", "cannot write its AOF (MISCONF)"),
        (info.get("rdb_last_bgsave_status") == "err", "its last snapshot failed (MISCONF "
                                                      "while snapshots are on)"),
        (info.get("loading"), "loading its data (LOADING)"),
        (info.get("role") == "slave", "a read-only replica (READONLY)")) if failed]
    return {**memory, "refusing": "; ".join(reasons) or None}
