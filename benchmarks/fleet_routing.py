"""Routing at fleet scale: what one submit costs, and what a router reads and applies.

Pure and in-process (no Redis, no workers): a full snapshot shaped like beat's (worker
records as the heartbeat merges them: 1-3 warm models of 200 with Zipf popularity, a
model loading on some, budgets of 32-80 GB, jobs in flight per lane, queued jobs,
service times per lane, load times per model) is split into the two parts beat writes
(``routing.compact``) and fed to a ``SnapshotCache`` with a members reader, as a
submitting process holds it. Measured at each size:

- ``decide_p50_us`` / ``decide_p99_us``: ``decide()`` for one job (a Zipf-drawn model;
  one in ten with a route key, see :func:`route_key`) on the view ``cache.view()`` gave
  for it, the router counting its own send after each (``note_sent``), 4,000 jobs at
  the fleet's whole service rate (``jobs_per_s``: one router feeding the fleet), over as
  many heartbeats as that takes (``MIN_BEATS`` at least), after a quarter as many
  unmeasured (a process that has run a while, routing for this fleet only: the ring
  orders it kept for another size or seed are dropped first);
  ``view_decide_p99_us``: the same with ``view()`` counted in; ``note_sent_p99_us``:
  counting the job's send after it (its load, the warm model it leaves, the demand);
- ``snapshot_bytes``: the compact JSON read twice a second; ``members_bytes``: the
  membership, read only when its version changes;
- ``apply_ms``: applying a new compact snapshot of the same membership (median);
- ``members_apply_ms``: applying one whose membership changed (a worker loaded a
  model; median), and ``join_apply_ms``: one where a worker joined (the ring derived).

``python benchmarks/fleet_routing.py`` prints the table for 10, 100, 1,000 and 10,000
workers (each figure the median of three runs with different seeds).
"""
from __future__ import annotations

import gc
import json
import random
import sys
import time
from pathlib import Path
from typing import Callable

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.common import markdown_table, percentile  # noqa: E402
from routing.compact import split  # noqa: E402
from routing.names import LANES  # noqa: E402
from routing.policy import decide  # noqa: E402
from routing.ringorder import forget  # noqa: E402
from routing.snapshot import SnapshotCache  # noqa: E402
from tests.harness.fleet import (  # noqa: E402
    MODELS,
    WEIGHTS,
    fleet_snapshot,
    worker_record,
)

TIERS = ("fast", "standard", "relaxed")
DEPTHS = {"fast": 10_000, "standard": 10_000, "relaxed": 10_000}
#: Seconds between snapshots: beat's heartbeat as a router reads it (twice a second).
HEARTBEAT_S = 0.5
#: Heartbeats measured at least (10,000 workers' 4,000 jobs fill two: the median apply
#: of two would be one noisy sample).
MIN_BEATS = 6


def _next(snapshot: dict, rng: random.Random, now_s: float) -> dict:
    """The heartbeat's snapshot at ``now_s``: new loads, the same membership."""
    workers = {}
    for host, record in snapshot["workers"].items():
        warm = record["warm_models"]
        if len(warm) > 1 and rng.random() < 0.2:  # it ran another of its models
            pick = rng.choice(warm)
            warm = [m for m in warm if m != pick] + [pick]
        workers[host] = {**record, "warm_models": warm, "queued": rng.choice((0, 0, 1, 2, 4)),
                         "in_flight": {lane: rng.randint(0, 1) for lane in LANES}}
    return {**snapshot, "at": now_s, "measured_at": now_s - 0.05, "workers": workers}


def _loaded(snapshot: dict, rng: random.Random, now_s: float) -> dict:
    """The heartbeat after ``snapshot``, where a worker finished loading a model."""
    snapshot = _next(snapshot, rng, now_s)
    host = rng.choice(sorted(snapshot["workers"]))
    record = snapshot["workers"][host]
    snapshot["workers"][host] = {**record, "warm_models": [*record["warm_models"][1:],
                                                            rng.choice(MODELS)]}
    return snapshot


def _joined(snapshot: dict, rng: random.Random, now_s: float) -> dict:
    """The heartbeat after ``snapshot``, where a worker joined."""
    snapshot = _next(snapshot, rng, now_s)
    snapshot["workers"]["gpu0@joined"] = worker_record(rng, "gpu0@joined", now_s)
    return snapshot


class _Beat:
    """What beat writes, made beforehand (a router process does not hold beat's full
    snapshots): each heartbeat's compact JSON, and each members version's."""

    def __init__(self, workers: int, seed: int, beats: int, changes: int) -> None:
        rng = random.Random(seed)
        snapshot = fleet_snapshot(workers, seed)
        self.start_s = snapshot["at"]
        self.full_bytes = len(json.dumps(snapshot))
        self.jobs_per_s = service_rate(snapshot)
        self.members: dict[str, str] = {}
        self.compact = [self._write(snapshot)]
        steps = [_next] * beats + [_loaded] * changes + [_joined]
        for k, step in enumerate(steps, start=1):
            snapshot = step(snapshot, rng, self.start_s + k * HEARTBEAT_S)
            self.compact.append(self._write(snapshot))
        self.current = self.compact[0]

    def _write(self, snapshot: dict) -> str:
        compact, members = split(snapshot)
        self.members[members["version"]] = json.dumps(members, separators=(",", ":"))
        return json.dumps(compact, separators=(",", ":"))

    def beat(self, k: int) -> None:
        """Heartbeat ``k`` is written: routers read it from now on."""
        self.current = self.compact[k]


def service_rate(snapshot: dict) -> float:
    """Jobs per second the fleet finishes: each worker's concurrency over its mean
    service time."""
    rate = 0.0
    for worker in snapshot["workers"].values():
        samples = list(worker["service_ms"].values()) or [2000.0]
        rate += worker["concurrency"] * 1000 / (sum(samples) / len(samples))
    return rate


def _timed_ms(action: Callable[[], None]) -> float:
    began = time.perf_counter()
    action()
    return (time.perf_counter() - began) * 1000


def route_key(rng: random.Random, model: str) -> str | None:
    """A job's route key: three in ten jobs of the three most wanted models (the base
    models LoRAs are made for) name one of 50 LoRAs: a tenth of all jobs."""
    return f"lora-{rng.randrange(50)}" if model in MODELS[:3] and rng.random() < 0.3 \
        else None


def _decides(cache: SnapshotCache, rng: random.Random, now: list[float],
             jobs: int) -> tuple[list[float], list[float], list[float]]:
    """Microseconds of decide() per job, of view() + decide(), and of counting its
    send (note_sent); ``jobs`` spread over one heartbeat (``HEARTBEAT_S``) of the clock."""
    decides, routes, sends = [], [], []
    for _ in range(jobs):
        model = rng.choices(MODELS, WEIGHTS)[0]
        key = route_key(rng, model)
        tier = rng.choice(TIERS)
        now[0] += HEARTBEAT_S / jobs
        began = time.perf_counter()
        view = cache.view()
        viewed = time.perf_counter()
        route = decide(tier, "acct", True, view, model, route_key=key)
        done = time.perf_counter()
        cache.note_sent(route.lane, route.node, model)
        decides.append((done - viewed) * 1e6)
        routes.append((done - began) * 1e6)
        sends.append((time.perf_counter() - done) * 1e6)
    return decides, routes, sends


def measure(workers: int, jobs: int = 4000, load: float = 1.0, seed: int = 1,
            changes: int = 5) -> dict:
    """The figures of one fleet size (see the module's docstring): ``jobs`` measured,
    sent at ``load`` times the fleet's service rate, after a quarter as many unmeasured."""
    forget()  # a router of this fleet: no order kept for another size or seed
    per_beat = _per_beat(workers, seed, load)
    beats = max(-(-jobs // per_beat), MIN_BEATS)
    warm = -(-beats // 4)
    beat = _Beat(workers, seed, warm + beats, changes)
    gc.collect()  # beat's records are gone: what is left is what a router holds
    rng, now = random.Random(seed), [beat.start_s]
    cache = SnapshotCache(lambda: beat.current, refresh_s=HEARTBEAT_S, stale_s=30.0,
                          max_depth=DEPTHS, clock=lambda: now[0],
                          fetch_members=beat.members.get)
    cache._thread = object()  # refreshed by hand: no background thread
    cache.refresh()
    decides, routes, sends, apply_ms, members_ms = [], [], [], [], []
    for k in range(1, warm + beats + changes + 2):
        now[0] = beat.start_s + k * HEARTBEAT_S
        beat.beat(k)
        took_ms = _timed_ms(cache.refresh)
        if k > warm + beats:
            members_ms.append(took_ms)
            continue
        times = _decides(cache, rng, now, per_beat)
        if k > warm:
            apply_ms.append(took_ms)
            decides += times[0]
            routes += times[1]
            sends += times[2]
    compact = beat.compact[0]
    return {"workers": workers, "jobs_per_s": round(per_beat / HEARTBEAT_S),
            "decide_p50_us": round(percentile(decides, 0.5), 1),
            "decide_p99_us": round(percentile(decides, 0.99), 1),
            "view_decide_p99_us": round(percentile(routes, 0.99), 1),
            "note_sent_p99_us": round(percentile(sends, 0.99), 1),
            "snapshot_bytes": len(compact),
            "members_bytes": len(beat.members[json.loads(compact)["members"]]),
            "full_snapshot_bytes": beat.full_bytes,
            "apply_ms": round(percentile(apply_ms, 0.5), 2),
            "members_apply_ms": round(percentile(members_ms[:-1], 0.5), 2),
            "join_apply_ms": round(members_ms[-1], 2)}


def _per_beat(workers: int, seed: int, load: float) -> int:
    """Jobs this router sends per heartbeat: ``load`` times what the fleet finishes."""
    return max(1, round(load * service_rate(fleet_snapshot(workers, seed)) * HEARTBEAT_S))


COLUMNS = ("workers", "jobs_per_s", "decide_p50_us", "decide_p99_us", "view_decide_p99_us",
           "note_sent_p99_us", "snapshot_bytes", "members_bytes", "full_snapshot_bytes",
           "apply_ms", "members_apply_ms", "join_apply_ms")


def median_of(runs: int, workers: int) -> dict:
    """Each figure's median over ``runs`` measurements (a shared machine's noise)."""
    found = [measure(workers, seed=seed) for seed in range(1, runs + 1)]
    return {column: sorted(run[column] for run in found)[runs // 2] for column in COLUMNS}


def main() -> None:
    """Print the table for 10, 100, 1,000 and 10,000 workers: medians of three runs."""
    rows = [median_of(3, size) for size in (10, 100, 1000, 10_000)]
    print(markdown_table(COLUMNS, [[row[c] for c in COLUMNS] for row in rows]))


if __name__ == "__main__":
    main()
