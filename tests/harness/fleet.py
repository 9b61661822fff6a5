"""A fleet's full snapshot as beat built it before the split (``routing.compact``):
worker records as the heartbeat merges them, 1-3 warm models of 200 with Zipf
popularity, a model loading on some, budgets of 32-80 GB, jobs in flight per lane, queued jobs,
service times per lane, load times per model. Pure: no Redis, no workers."""
from __future__ import annotations

import random
from typing import Any

from routing.names import LANES, worker_queues

MODELS = [f"model-{i:03d}" for i in range(200)]
#: Each model's size in MB: 8 to 24 GB, fixed by its name.
SIZES_MB = {model: 8192 * (1 + i % 3) for i, model in enumerate(MODELS)}
#: Zipf weights of the models (s = 1.1): a few are wanted everywhere, most rarely.
WEIGHTS = [1 / (rank + 1) ** 1.1 for rank in range(len(MODELS))]


def worker_record(rng: random.Random, host: str, now: float) -> dict[str, Any]:
    """One worker's record as beat merges its heartbeat reply."""
    budget_mb = 16384 * rng.randint(2, 5)
    warm = list(dict.fromkeys(rng.choices(MODELS, WEIGHTS, k=rng.randint(1, 3))))
    loading = [m for m in rng.choices(MODELS, WEIGHTS) if m not in warm] \
        if rng.random() < 0.05 else []
    pid, started = rng.randint(1000, 99999), now - rng.uniform(60, 86400)
    return {
        "device": f"cuda:{host[3]}", "pid": pid, "at": now - rng.uniform(0, 0.3),
        "incarnation": f"{host}/{pid}/{started:.3f}", "started_at": started,
        "in_flight": {lane: rng.randint(0, 1) for lane in LANES},
        "served": rng.randint(0, 50_000), "failed": rng.randint(0, 20),
        "service_ms": {lane: rng.uniform(200, 4000) for lane in LANES if rng.random() < 0.9},
        "cost_ms": {m: [round(rng.uniform(50, 300), 3), round(rng.uniform(10, 90), 3)]
                    for m in warm},
        "warm_models": warm, "memory_mb": budget_mb, "loading_models": loading,
        "model_mb": {m: SIZES_MB[m] for m in warm},
        "load_ms": {m: rng.uniform(800, 9000) for m in {*warm, *rng.choices(MODELS, k=2)}},
        "queues": worker_queues(host), "lanes": list(LANES), "concurrency": 1,
        "sick": None, "worker_faults": 0, "queued": rng.choice((0, 0, 0, 1, 2, 3, 5, 8)),
        "last_seen": now, "missed": 0, "alive": True,
    }


def hosts_of(workers: int) -> list[str]:
    """Celery node names of ``workers`` GPUs, eight to a machine."""
    return [f"gpu{i % 8}@node-{i // 8:04d}" for i in range(workers)]


def fleet_snapshot(workers: int, seed: int = 0, now: float = 1_700_000_000.0) -> dict:
    """A full snapshot of ``workers`` serving workers, as beat built it before the split."""
    rng = random.Random(seed)
    records = {host: worker_record(rng, host, now) for host in hosts_of(workers)}
    lanes = {lane: {"depth": rng.randint(0, 50), "in_flight": rng.randint(0, workers),
                    "workers": workers, "service_s": 1.2, "queued_job_s": 1.3,
                    "expected_wait_s": round(rng.uniform(0, 5), 3)} for lane in LANES}
    return {"at": now, "measured_at": now - 0.05, "lanes": lanes,
            "policy": {lane: {"overloaded": False, "calm_samples": 0}
                       for lane in ("fast", "standard")},
            "workers": records, "exhausted": [], "levels": {}}
