"""Where models should be warm: pure choices over the worker record."""
from __future__ import annotations

import bisect
import hashlib
import math
from typing import Any, Collection, Iterable, Mapping


def serving(worker: Mapping[str, Any]) -> bool:
    """Whether jobs may go to this worker record: alive (it answers heartbeats) and
    not sick (it did not step aside after failures of its own making)."""
    return bool(worker.get("alive")) and not worker.get("sick")


def holders(workers: Mapping[str, dict], model: str) -> list[str]:
    """Serving workers that hold ``model`` warm or are loading it."""
    return sorted(host for host, w in workers.items() if serving(w) and (
        model in w.get("warm_models", ()) or model in w.get("loading_models", ())))


def prewarm_targets(workers: Mapping[str, dict], model: str, replicas: int) -> list[str]:
    """Serving workers to load ``model`` on so that ``replicas`` hold it.

    Least busy first (fewest jobs in flight, then fewest warm models), so a
    prewarm lands where it displaces the least.
    """
    missing = replicas - len(holders(workers, model))
    if missing <= 0:
        return []
    have = set(holders(workers, model))
    candidates = [(sum(w.get("in_flight", {}).values()), len(w.get("warm_models", ())), host)
                  for host, w in workers.items() if serving(w) and host not in have]
    return [host for *_, host in sorted(candidates)[:missing]]


#: Points per worker on the hash ring: enough to spread models evenly.
VNODES = 64
#: A worker takes at least this many jobs (one running, one waiting) before it
#: passes work on: a cold load elsewhere costs more than one job's wait.
MIN_CAP = 2


def _point(key: str) -> int:
    return int.from_bytes(hashlib.blake2b(key.encode(), digest_size=8).digest(), "big")


def ring(nodes: Iterable[str]) -> tuple[tuple[int, ...], tuple[str, ...]]:
    """The consistent-hash ring of ``nodes``: sorted points and their owners."""
    points = sorted((_point(f"{node}#{v}"), node) for node in set(nodes) for v in range(VNODES))
    return tuple(p for p, _ in points), tuple(n for _, n in points)


def _ring_order(model: str, points: tuple[int, ...], owners: tuple[str, ...],
                nodes: int) -> list[str]:
    """Distinct workers in ring order from ``model``'s point (stops once all are seen)."""
    start, order = bisect.bisect(points, _point(model)), []
    for step in range(len(points)):
        node = owners[(start + step) % len(points)]
        if node not in order:
            order.append(node)
            if len(order) == nodes:
                break
    return order


def assign_homes(models: Iterable[str], hash_ring: tuple[tuple[int, ...], tuple[str, ...]],
                 slots: Mapping[str, int],
                 previous: Mapping[str, str] | None = None) -> dict[str, str]:
    """Each model's first worker: consistent hashing bounded by model slots.

    ``models`` in order of demand, most wanted first: each takes the first
    worker on its ring walk that has a slot no earlier model took, so no
    worker becomes the home of more models than it can hold warm. Models
    left over when every slot is taken get no home (plain ring order). A
    model keeps its ``previous`` home while that has a slot: homes move only
    when workers or the set of wanted models change, never on noise.
    """
    points, owners = hash_ring
    nodes, taken, homes = len(set(owners)), dict.fromkeys(owners, 0), {}
    for model in models:
        walk = _ring_order(model, points, owners, nodes)
        if (previous or {}).get(model) in taken:
            walk.insert(0, previous[model])
        for node in walk:
            if taken[node] < slots.get(node, 1):
                homes[model], taken[node] = node, taken[node] + 1
                break
    return homes


def home(model: str, hash_ring: tuple[tuple[int, ...], tuple[str, ...]],
         loads: Mapping[str, float], epsilon: float,
         warm: Mapping[str, Collection[str]] | None = None,
         drain_s: Mapping[str, float] | None = None, cold_s: float = 0.0,
         first: str | None = None, key: str | None = None) -> str | None:
    """The worker for ``model``: consistent hashing with bounded loads.

    Walk the ring from the model's point over the workers whose load (jobs
    running or queued for them) is under ``ceil((1 + epsilon) * mean)``,
    counting this job and never under ``MIN_CAP``; take the first that holds
    ``model`` warm, else the first. A model keeps landing on its warm worker;
    when that one is overloaded, on the next warm one, and only then cold.

    Delay scheduling: when every warm holder is over the cap, the job still
    waits for the one that drains soonest if that is sooner than loading the
    model (``cold_s``) on the first open worker and waiting there. ``drain_s``
    is each worker's seconds per queued job; without it a job never waits.

    ``first``: the model's worker from :func:`assign_homes`, tried before the
    rest of the ring. ``key``: the job's point on the ring in place of the model's (a
    route key, e.g. a LoRA's name: its jobs keep landing on one of the model's warm
    workers, and different keys spread over them).
    """
    points, owners = hash_ring
    nodes = set(owners)
    if not nodes:
        return None
    warm = warm or {}
    mean = (sum(loads.get(n, 0) for n in nodes) + 1) / len(nodes)
    cap = max(MIN_CAP, math.ceil((1 + epsilon) * mean))
    order = _ring_order(key or model, points, owners, len(nodes))
    if first in nodes:
        order = [first] + [node for node in order if node != first]
    open_nodes = [node for node in order if loads.get(node, 0) < cap]
    holding = [node for node in order if model in warm.get(node, ())]
    warm_open = [node for node in holding if node in open_nodes]
    if warm_open or not open_nodes:
        return (warm_open or holding or order)[0]
    if holding and drain_s:
        def wait_s(node: str) -> float:
            return loads.get(node, 0) * drain_s.get(node, 0.0)
        soonest = min(holding, key=wait_s)
        if wait_s(soonest) <= cold_s + wait_s(open_nodes[0]):
            return soonest
    return open_nodes[0]
