"""``lanes status`` for people: beat's leader, Redis' memory and refusals, lanes, pools
(workers wanted), workers (alive, sick, stuck) and exhausted accounts, from beat's
snapshot."""
from __future__ import annotations

import time
from typing import Any

from tasks.ops.group import duration, iso_time, table


def _lane_rows(snapshot: dict[str, Any]) -> list[tuple]:
    policy = snapshot.get("policy", {})
    rows = []
    for lane, load in snapshot.get("lanes", {}).items():
        overloaded = policy.get(lane, {}).get("overloaded")
        rows.append((lane, load.get("depth", 0), load.get("in_flight", 0),
                     load.get("workers", 0), duration(load.get("service_s", 0)),
                     duration(load.get("expected_wait_s", 0)),
                     "-" if overloaded is None else "YES" if overloaded else "no"))
    return rows


def _pool_rows(snapshot: dict[str, Any]) -> list[tuple]:
    return [(name, pool.get("current", 0), pool.get("wanted", 0),
             f"{pool.get('need', 0):.2f}", duration(pool.get("warm_s", 0)),
             ", ".join(pool.get("models", [])) or "-")
            for name, pool in sorted(snapshot.get("pools", {}).items())]


def _in_flight(worker: dict[str, Any]) -> int:
    jobs = worker.get("in_flight", 0)
    return sum(jobs.values()) if isinstance(jobs, dict) else int(jobs)


def _health(worker: dict[str, Any]) -> str:
    """``yes``; ``NO (missed 2)`` when silent; ``SICK: <reason>`` when it stepped aside;
    ``STUCK: <reason>`` when a finished run holds a job slot; ``LEAVING`` once it shuts
    down."""
    if not worker.get("alive"):
        return f"NO (missed {worker.get('missed', '?')})"
    if worker.get("leaving"):
        return "LEAVING"
    if worker.get("stuck"):
        return f"STUCK: {worker['stuck']}"
    return f"SICK: {worker['sick']}" if worker.get("sick") else "yes"


def _worker_rows(snapshot: dict[str, Any]) -> list[tuple]:
    rows = []
    for host, worker in sorted(snapshot.get("workers", {}).items()):
        rows.append((host, _health(worker), worker.get("device", "-"), _in_flight(worker),
                     _warm(worker)))
    return rows


def _warm(worker: dict[str, Any]) -> str:
    """Warm models with the cold-start time each cost: ``demo (412ms), demo-3 (398ms)``."""
    load_ms = worker.get("load_ms", {})
    models = [f"{m} ({load_ms[m]:.0f}ms)" if m in load_ms else m
              for m in worker.get("warm_models", [])]
    models += [f"{m} (loading)" for m in worker.get("loading_models", [])]
    return ", ".join(models) or "-"


def _snapshot_header(snapshot: dict[str, Any]) -> str:
    from tasks.settings import settings

    age_s = max(0.0, time.time() - snapshot.get("at", 0))
    line = f"snapshot of {iso_time(snapshot.get('at', 0))} ({duration(age_s)} ago)"
    if age_s > settings.snapshot_stale_s:
        line += (f"\nWARNING: older than {duration(settings.snapshot_stale_s)}; "
                 "routers ignore it. Is `celery -A tasks beat` running?")
    return line


def _beat_line(snapshot: dict[str, Any]) -> str:
    beat = snapshot.get("beat") or {}
    if not beat.get("leader"):
        return f"beat: no leader now (last epoch {beat.get('epoch', 0)})"
    return f"beat: led by {beat['leader']}, epoch {beat['epoch']}"


def _redis_line(snapshot: dict[str, Any]) -> str:
    """Redis' memory and whether it refuses writes, as read now (else as beat measured
    it), and whether new jobs are refused for its memory."""
    from tasks.broker.memory import MEMORY_LIMIT

    memory = snapshot.get("redis") or {}
    refusing = f"; REFUSING WRITES: {memory['refusing']}" if memory.get("refusing") else ""
    if memory.get("policy") not in (None, "noeviction"):
        refusing += f"; EVICTS KEYS (maxmemory-policy {memory['policy']}): set noeviction"
    if not memory.get("max_mb"):
        return f"redis: {memory.get('used_mb', '?')} MB used, no maxmemory set{refusing}"
    share = memory.get("memory_share", 0.0)
    refused = (f"; NEW JOBS REFUSED (over {MEMORY_LIMIT:.0%})"
               if share > MEMORY_LIMIT else "")
    return (f"redis: {memory['used_mb']} of {memory['max_mb']} MB ({share:.0%})"
            f"{refused}{refusing}")


def render_status(snapshot: dict[str, Any]) -> str:
    """The snapshot for people: beat's leader, Redis' memory, lanes, pools, workers,
    exhausted accounts."""
    parts = [_snapshot_header(snapshot), _beat_line(snapshot), _redis_line(snapshot), "",
             table(["lane", "depth", "in flight", "workers", "service", "expected wait",
                    "overloaded"], _lane_rows(snapshot)), ""]
    pools = _pool_rows(snapshot)
    if pools:
        parts += [table(["pool", "workers", "wanted", "need", "warm-up", "models"], pools),
                  ""]
    workers = _worker_rows(snapshot)
    parts.append(table(["worker", "health", "device", "in flight", "warm models (cold start)"],
                       workers)
                 if workers else "no workers have answered a heartbeat")
    exhausted = snapshot.get("exhausted", [])
    parts += ["", "fast time exhausted: " + (", ".join(exhausted) or "none")]
    return "\n".join(parts)
