"""Heartbeats: ask every worker for its load, record liveness and lane depths in Redis."""
from __future__ import annotations

import json
import logging
import time
from functools import lru_cache
from typing import Any

import redis

import celeryconfig as cfg
from routing.names import HEARTBEAT_TASK, LANES, SNAPSHOT_KEY, STATS_COMMAND, WORKERS_KEY
from routing.store import connect
from tasks.celeryapp import app

log = logging.getLogger(__name__)
#: Heartbeats a worker may miss before it counts as dead.
MISSES_ALLOWED = 2
#: A worker silent this long is dropped from the record altogether.
FORGET_AFTER_S = 600.0


def merge(previous: dict[str, dict], replies: dict[str, dict], now: float,
          heartbeat_s: float) -> dict[str, dict]:
    """Fold this round's replies into the record: pure, so tests drive it directly."""
    record: dict[str, dict] = {}
    for host, old in previous.items():
        if host not in replies and now - old["last_seen"] < FORGET_AFTER_S:
            missed = int((now - old["last_seen"]) // heartbeat_s)
            record[host] = {**old, "missed": missed, "alive": missed < MISSES_ALLOWED}
    for host, stats in replies.items():
        record[host] = {**stats, "last_seen": now, "missed": 0, "alive": True}
    return record


def ask_workers(timeout_s: float) -> dict[str, dict]:
    """Broadcast the stats command; {hostname: reply} from each worker that answered."""
    answers = app.control.broadcast(STATS_COMMAND, reply=True, timeout=timeout_s)
    return {host: reply for answer in answers or [] for host, reply in answer.items()
            if isinstance(reply, dict) and "error" not in reply}


@lru_cache(maxsize=1)
def _redis() -> redis.Redis:
    return connect(app.conf.broker_url)


def _lane_depths(client: redis.Redis) -> dict[str, int]:
    with client.pipeline(transaction=False) as pipe:
        for lane in LANES:
            pipe.llen(lane)
        return dict(zip(LANES, pipe.execute()))


@app.task(name=HEARTBEAT_TASK)
def heartbeat() -> dict[str, Any]:
    """One heartbeat round; returns and stores the snapshot."""
    client = _redis()
    replies = ask_workers(cfg.HEARTBEAT_REPLY_S)
    now = time.time()
    previous = {h: json.loads(v) for h, v in client.hgetall(WORKERS_KEY).items()}
    workers = merge(previous, replies, now, cfg.HEARTBEAT_S)
    snapshot = {"at": now, "lanes": _lane_depths(client), "workers": workers}
    with client.pipeline() as pipe:
        pipe.delete(WORKERS_KEY)
        if workers:
            pipe.hset(WORKERS_KEY, mapping={h: json.dumps(w) for h, w in workers.items()})
        pipe.set(SNAPSHOT_KEY, json.dumps(snapshot)).execute()
    return snapshot
