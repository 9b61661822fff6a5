"""Each round, the workers each pool wants (``routing.scaling``), from the round's
measures: the workers' busy slots and service times, each lane's queued jobs and their
models, and the scale each pool had last round (``SCALING_KEY``).

A pool is the workers that name it (``GPULANES_POOL``); it serves the models they hold
warm or load, and the pools remember them, so a pool scaled to zero still counts the
jobs of its models. A lane's queued jobs go to the pools by the models of the lane's
sample (``beat.costs``), shared among the pools that hold a model; a model no pool
holds goes to the default pool. A lane's arrivals into a pool are the jobs its workers
served (busy slots over the service time) plus the growth of its queued jobs.
"""
from __future__ import annotations

import json
from typing import Any, Mapping

import redis

from beat.snapshot import QueuedJob
from beat.tally import DEFAULT_POOL, Pool, Tally
from routing.names import LANES
from routing.scaling import LaneMeasure, scale_round
from tasks.broker.keys import SCALING_KEY

#: Seconds a new worker takes to start before it loads its models (a container's
#: scheduling and start); its models' load time, as measured, is added.
BOOT_S = 60.0
#: Seconds the need must stay lower before a pool scales down (KEDA's cooldown).
DOWN_AFTER_S = 300.0
#: The share of each budgeted lane's jobs that must start within its budget.
WITHIN = {"fast": 0.999, "standard": 0.95}
#: Seconds a pool no worker names any more is remembered (its models, its scale).
POOL_MEMORY_S = 86400.0


def pools_of(workers: Mapping[str, dict] | Tally,
             previous: Mapping[str, dict]) -> dict[str, set[str]]:
    """Each pool's models: those its living workers hold or load, and those it had."""
    tally = workers if isinstance(workers, Tally) else Tally.of(workers)
    pools = {name: set(doc.get("models", ())) for name, doc in previous.items()}
    pools.setdefault(DEFAULT_POOL, set())
    for name, pool in tally.pools.items():
        if pool.alive:
            pools.setdefault(name, set()).update(pool.models)
    return pools


def shares(pools: Mapping[str, set[str]], sample: list[QueuedJob]) -> dict[str, float]:
    """The share of a lane's queued jobs each pool serves, by its sample's models."""
    holders: dict[str, list[str]] = {}
    for name, models in pools.items():
        for model in models:
            holders.setdefault(model, []).append(name)
    found = {name: 0.0 for name in pools}
    for model, _, weight in sample:
        owners = holders.get(model) or [DEFAULT_POOL]
        for name in owners:
            found[name] += weight / len(owners)
    total = sum(found.values())
    return {name: (w / total if total else float(name == DEFAULT_POOL))
            for name, w in found.items()}


def plan(previous: Mapping[str, dict], workers: Mapping[str, dict],
         loads: Mapping[str, Mapping[str, Any]], sample: Mapping[str, list[QueuedJob]],
         budgets_s: Mapping[str, float], now: float,
         tally: Tally | None = None) -> dict[str, dict]:
    """Every pool's scale after this round (pure): the doc beat stores and shows
    (``tally``: the workers' figures as beat keeps them; else added up here)."""
    tally = Tally.of(workers) if tally is None else tally
    pools = pools_of(tally, previous)
    share = {lane: shares(pools, sample.get(lane, [])) for lane in LANES}
    found = {}
    for name, models in sorted(pools.items()):
        members = tally.pools.get(name, Pool())
        old = previous.get(name, {})
        if not members.members and not old.get("wanted") and name != DEFAULT_POOL and \
                now - old.get("seen", now) > POOL_MEMORY_S:
            continue
        found[name] = _pool(name, old, members, models, loads, share, budgets_s, now)
    return found


def _pool(name: str, old: Mapping[str, Any], members: Pool, models: set[str],
          loads: Mapping[str, Mapping[str, Any]], share: Mapping[str, Mapping[str, float]],
          budgets_s: Mapping[str, float], now: float) -> dict[str, Any]:
    """One pool's scale: its measures per lane, then ``routing.scaling.scale_round``.
    A new worker takes ``BOOT_S`` and the longest load a member measured to warm up."""
    warm_s = BOOT_S + max(members.load_s, default=0.0)
    sums = members.sums
    slots = sums.slots / members.live if members.live else 1.0
    measures = {}
    for lane in LANES:
        load = loads.get(lane, {})
        measured_s = sums.service_ms[lane] / sums.measured[lane] / 1000 \
            if sums.measured[lane] else None
        service_s = measured_s or load.get("service_s") or 1.0
        measures[lane] = LaneMeasure(
            busy=sums.busy[lane], service_s=service_s,
            queued=load.get("depth", 0) * share[lane].get(name, 0.0),
            queued_job_s=load.get("queued_job_s"))
    scale = scale_round(old, measures, budgets_s, WITHIN, slots, warm_s, now, DOWN_AFTER_S)
    return {**scale, "current": members.live, "warm_s": round(warm_s, 1),
            "models": sorted(models), "seen": now if members.members else old.get("seen", now)}


def read(client: redis.Redis) -> dict[str, dict]:
    """The pools' scale beat stored last ({} before its first round)."""
    raw = client.get(SCALING_KEY)
    return json.loads(raw).get("pools", {}) if raw else {}


def write(client: redis.Redis, pools: Mapping[str, dict], now: float) -> None:
    client.set(SCALING_KEY, json.dumps({"at": now, "pools": pools}))
