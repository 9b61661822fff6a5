"""Where models should be warm: pure choices over the worker record."""
from __future__ import annotations

import math
from itertools import chain, islice
from typing import AbstractSet, Any, Collection, Iterable, Iterator, Mapping

from routing.hashring import VNODES, HashRing, as_ring, point, ring
from routing.ringorder import ask, in_ring_order, kept_order


def serving(worker: Mapping[str, Any]) -> bool:
    """Whether jobs may go to this worker record: alive (it answers heartbeats), not
    sick (it did not step aside after failures of its own making), not stuck (a
    finished run of its holds a job slot: ``gpu_worker.stuck``) and not leaving (it
    shuts down: its last push says so)."""
    return (bool(worker.get("alive")) and not worker.get("sick") and not worker.get("stuck")
            and not worker.get("leaving"))


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


#: A worker takes at least this many jobs (one running, one waiting) before it
#: passes work on: a cold load elsewhere costs more than one job's wait.
MIN_CAP = 2
#: Warm holders of a model weighed for delay scheduling: the first ones in ring order
#: from the job's point (a hot model is warm on hundreds of workers at scale).
DELAY_HOLDERS = 16
#: A model held on at least one worker in this many is "widely held": unless its
#: order is kept for the key (``routing.ringorder.order_asked`` puts the keys in use in order
#: after each snapshot, off the jobs' path), its first holders come from a walk of the
#: ring from the job's point (one every few steps), not from the ring order of all of
#: them (hundreds: a bisect each).
WIDE_SHARE = 32
#: Points of the ring such a walk passes (the ones of other workers skipped in C) before
#: the holders' ring order is computed.
WIDE_WALK_POINTS = 256
#: A fast job goes to a warm holder with less than this much fast work (its fast job
#: running, or those in its own fast queue, as the router estimates them now): there it
#: starts at once, or at the running job's next step boundary (a fast job preempts
#: any other), never behind another fast job, which nothing preempts.
FAST_CAP = 0.5
#: What the ring module exports through this one (callers import them from here).
__all__ = ["VNODES", "MIN_CAP", "DELAY_HOLDERS", "FAST_CAP", "HashRing", "ring", "point", "serving",
           "holders", "prewarm_targets", "assign_homes", "home", "model_mb", "touched"]
_NONE: frozenset[str] = frozenset()


def model_mb(model: str, sizes: Mapping[str, int] | None, budget_mb: float) -> float:
    """What ``model`` takes of a worker's budget: 1 without ``sizes`` (budgets then
    count models), else its size; a size not known yet counts as the largest known,
    or, with none known, half the worker's budget."""
    if sizes is None:
        return 1
    size = sizes.get(model)
    if size is None:
        size = max(sizes.values(), default=None)
    return budget_mb / 2 if size is None else size


def touched(warm: tuple[str, ...], model: str, budget: float,
            sizes: Mapping[str, int] | None = None) -> tuple[str, ...]:
    """A worker's warm models, least recently used first, after it runs ``model``: the
    least recently used go until their sizes fit its ``budget`` (MB; ``model`` stays).
    Without ``sizes`` every model takes 1 (the budget counts models)."""
    kept = [m for m in warm if m != model] + [model]
    held = sum(model_mb(m, sizes, budget) for m in kept)
    while len(kept) > 1 and held > budget:
        held -= model_mb(kept.pop(0), sizes, budget)
    return tuple(kept)


def assign_homes(models: Iterable[str], hash_ring: tuple[tuple[int, ...], tuple[str, ...]],
                 budgets: Mapping[str, int],
                 previous: Mapping[str, str] | None = None,
                 capacity: int | None = None,
                 sizes: Mapping[str, int] | None = None) -> dict[str, str]:
    """Each model's first worker: consistent hashing bounded by the workers' memory.

    ``models`` in order of demand, most wanted first: each takes the first worker on
    its ring walk whose budget (``budgets``, MB) still has room for its size
    (``sizes``, MB: ``model_mb``) after the earlier models' homes there, so no worker
    becomes the home of more than it can hold warm. A model that fits nowhere gets no
    home (plain ring order). A model keeps its ``previous`` home while that has room:
    homes move only when workers or the set of wanted models change, never on noise.
    Without ``sizes`` every model takes 1 and budgets count models.
    ``capacity``: the budgets of all the ring's workers summed, when the caller keeps it.
    """
    hash_ring = as_ring(hash_ring)
    nodes, previous = hash_ring.nodes, previous or {}
    free = sum(max(0, budgets.get(node, 1)) for node in nodes) if capacity is None \
        else capacity
    taken: dict[str, float] = {}
    homes: dict[str, str] = {}
    fits_nowhere = math.inf  # sizes that found no room: no larger one can (room shrinks)

    def room(node: str, model: str) -> float:
        budget = budgets.get(node, 1)
        return budget - taken.get(node, 0) - model_mb(model, sizes, budget)

    for model in models:
        if free <= 0:  # every budget is taken: no walk can find room
            break
        size = model_mb(model, sizes, 0)  # the same on every worker when sizes are known
        if size >= fits_nowhere:
            continue
        before = previous.get(model)
        if before in nodes and room(before, model) >= 0:
            node = before  # it keeps its home (the common case: no walk at all)
        else:
            node = next((node for node in hash_ring.walk(model) if room(node, model) >= 0),
                        None)
            if node is None:
                if not sizes:  # every model takes the same: none after it finds room
                    break
                fits_nowhere = min(fits_nowhere, size)
                continue
        need = model_mb(model, sizes, budgets.get(node, 1))
        homes[model], taken[node], free = node, taken.get(node, 0) + need, free - need
    return homes


def home(model: str, hash_ring: tuple[tuple[int, ...], tuple[str, ...]],
         loads: Mapping[str, float], epsilon: float,
         warm: Mapping[str, Collection[str]] | None = None,
         drain_s: Mapping[str, float] | None = None, cold_s: float = 0.0,
         first: str | None = None, key: str | None = None, *,
         holders: Mapping[str, AbstractSet[str]] | None = None,
         load_sum: float | None = None,
         fast_loads: Mapping[str, float] | None = None,
         first_loads: Mapping[str, float] | None = None) -> str | None:
    """The worker for ``model``: consistent hashing with bounded loads.

    Walk the ring from the model's point over the workers whose load (jobs
    running or queued for them) is under ``ceil((1 + epsilon) * mean)``,
    counting this job and never under ``MIN_CAP``; take the first that holds
    ``model`` warm, else the first. A model keeps landing on its warm worker;
    when that one is overloaded, on the next warm one, and only then cold.

    Delay scheduling: when every warm holder is over the cap, the job still
    waits for the one that drains soonest (of the first ``DELAY_HOLDERS`` in ring
    order) if that is sooner than loading the model (``cold_s``) on the first open
    worker and waiting there. ``drain_s`` is each worker's seconds per queued job;
    without it a job never waits.

    ``first``: the model's worker from :func:`assign_homes`, tried before the
    rest of the ring. ``key``: the job's point on the ring in place of the model's (a
    route key, e.g. a LoRA's name: its jobs keep landing on one of the model's warm
    workers, and different keys spread over them).

    ``holders`` (model -> workers holding it warm, on the ring) and ``load_sum`` (the
    sum of ``loads`` over the ring's workers): kept by the snapshot cache so that a job
    costs a few steps; without them both are found from ``warm`` and ``loads`` (a
    pass over every worker).

    ``fast_loads`` (a fast job's placement: each worker's fast jobs, running or in its
    own queue): the choice above unless it has fast work (``FAST_CAP`` or more); then
    the first warm holder with none, however many standard and relaxed jobs it holds,
    since the fast job goes ahead of them and preempts the one running; when every
    holder has some, the delay rule above over the fast work alone. A fast job never
    waits behind another for want of looking.

    ``first_loads`` (each worker's first-level standard and fast work, running or in its
    own queue: ``routing.compact.first_work``): for a fast job, a warm holder with none
    is preferred to one with fast work alone, so that a fast job steps aside a heavier
    run, not a first-level one; for a first-level standard job (no ``fast_loads``), it
    is the work the job waits for, as ``fast_loads`` is a fast job's: the job steps a
    heavier run of its worker aside at its next step (``gpu_worker.preempt``).

    None (the shared lane) when every worker on the ring holds ``model`` warm and no
    ``key`` asks for one of them: any worker serves it warm, and the shared lane lets
    whichever is free first take it. A worker's own queue would only keep it there
    while that worker is busy, and, at the end of a backlog, leave another idle while
    it drains.
    """
    hash_ring = as_ring(hash_ring)
    nodes = hash_ring.nodes
    if not nodes:
        return None
    held, point_key = _holding(model, nodes, warm, holders), key or model
    if key is None and len(held) == len(nodes):
        return None
    if load_sum is None:
        load_sum = sum(loads.get(node, 0) for node in nodes)
    cap = max(MIN_CAP, math.ceil((1 + epsilon) * (load_sum + 1) / len(nodes)))
    front = first if first in held else None
    tiers = tuple(t for t in (first_loads, fast_loads) if t is not None)
    free = tiers[0] if tiers else None  # without the work this job would wait for
    if front is not None and loads.get(front, 0) < cap and \
            (free is None or free.get(front, 0) < FAST_CAP):
        return front  # the model's home, warm and open: the common case
    ordered = _ring_ordered(hash_ring, model, held, point_key)
    warm_open = first_below(loads, ordered, cap, point_key)
    if free is not None and (warm_open is None or free.get(warm_open, 0) >= FAST_CAP):
        return _fast_home(hash_ring, held, point_key, first, ordered, tiers, drain_s,
                          cold_s)
    if warm_open is not None:  # (a busy front is met again in ring order, and skipped)
        return warm_open
    return _spill(_holding_first(ordered, front),
                  _walk(hash_ring, point_key, first), loads, cap, drain_s, cold_s)


def _fast_home(hash_ring: HashRing, held: frozenset[str], key: str, first: str | None,
               ordered: Iterable[str], tiers: tuple[Mapping[str, float], ...],
               drain_s: Mapping[str, float] | None, cold_s: float) -> str | None:
    """:func:`home` of a fast or first-level standard job whose bounded-loads choice has
    work it would wait for (or that has none): the first warm holder free of each of
    ``tiers`` in turn (the work it would rather not preempt, then the work it would
    wait for), else by the last (``FAST_CAP``)."""
    front = first if first in held else None
    for work in tiers:
        if front is not None and work.get(front, 0) < FAST_CAP:
            return front
        free = first_below(work, ordered, FAST_CAP, key)
        if free is not None:
            return free
    return _spill(_holding_first(ordered, front),
                  _walk(hash_ring, key, first), tiers[-1], FAST_CAP, drain_s, cold_s)


def _holding_first(ordered: Iterable[str], front: str | None) -> list[str]:
    """The first ``DELAY_HOLDERS`` warm holders weighed for delay scheduling: ``front``
    (the model's home) and the next in ring order (``ordered``)."""
    holding = [front] if front is not None else []
    holding += islice((node for node in ordered if node != front),
                      DELAY_HOLDERS - len(holding))
    return holding


def _walk(hash_ring: HashRing, key: str, first: str | None) -> Iterator[str]:
    """The ring's workers from ``key``'s point, ``first`` (the model's home) before all."""
    if first not in hash_ring.nodes:
        return hash_ring.walk(key)
    return chain((first,), (node for node in hash_ring.walk(key) if node != first))


def _holding(model: str, nodes: AbstractSet[str],
             warm: Mapping[str, Collection[str]] | None,
             holders: Mapping[str, AbstractSet[str]] | None) -> frozenset[str]:
    """The ring's workers that hold ``model`` warm (or are loading it)."""
    if holders is not None:
        return holders.get(model, _NONE)
    return frozenset(node for node, models in (warm or {}).items()
                     if node in nodes and model in models)


def _ring_ordered(hash_ring: HashRing, model: str, held: frozenset[str],
                  key: str) -> Iterable[str]:
    """``model``'s holders ``held`` in ring order from ``key``'s point: the order kept
    for the key (or a patch away), else computed and kept (a model held on few
    workers), else walked as far as it is read (a widely held model)."""
    if not held:
        return ()
    ask(key, model)
    kept = kept_order(held, key)
    if kept is not None:
        return kept
    if len(held) * WIDE_SHARE < len(hash_ring.nodes):
        return in_ring_order(held, key)
    return _Walk(_walked(hash_ring, held, key))


class _Walk:
    """A walk of a widely held model's holders, read by each step of one job's choice
    from its start: walked once, as far as the furthest reader reads."""

    __slots__ = ("_walk", "_met")

    def __init__(self, walk: Iterator[str]) -> None:
        self._walk, self._met = walk, []

    def __iter__(self) -> Iterator[str]:
        met, at = self._met, 0
        while True:
            if at == len(met):
                node = next(self._walk, None)
                if node is None:
                    return
                met.append(node)
            yield met[at]
            at += 1


def _walked(hash_ring: HashRing, held: frozenset[str], key: str) -> Iterator[str]:
    found = 0
    for node in hash_ring.walk(key, among=held, points=WIDE_WALK_POINTS):
        yield node
        found += 1
    if found < len(held):
        yield from islice(in_ring_order(held, key), found, None)


def first_below(loads: Mapping[str, float], nodes: Iterable[str], cap: float,
                key: str | None = None) -> str | None:
    """The first of ``nodes`` whose load is under ``cap``; the snapshot cache's loads
    skip the holders it already found busy for ``key``, in one tight loop."""
    below = getattr(loads, "first_below", None)
    if below is not None:
        return below(nodes, cap, key)
    return next((node for node in nodes if loads.get(node, 0) < cap), None)


def _spill(holding: list[str], walk: Iterator[str], loads: Mapping[str, float], cap: float,
           drain_s: Mapping[str, float] | None, cold_s: float) -> str | None:
    """Every warm holder is busy: the first open worker on the walk, or the holder of
    ``holding`` (the first few, in order) that drains soonest when waiting for it beats
    a cold load there; with no open worker, the first holder, else the first worker."""
    first_node = next(walk, None)
    first_open = None if first_node is None else \
        first_below(loads, chain((first_node,), walk), cap)
    if first_open is None:
        return holding[0] if holding else first_node
    if holding and drain_s:
        waits = _waits_s(loads, [*holding, first_open], drain_s)
        soonest = min(range(len(holding)), key=waits.__getitem__)
        if waits[soonest] <= cold_s + waits[-1]:
            return holding[soonest]
    return first_open


def _waits_s(loads: Mapping[str, float], nodes: list[str],
             drain_s: Mapping[str, float]) -> list[float]:
    """How long a job queued at each of ``nodes`` waits: its load times its drain."""
    waits = getattr(loads, "waits_s", None)
    if waits is not None:
        return waits(nodes, drain_s)
    return [loads.get(node, 0) * drain_s.get(node, 0.0) for node in nodes]
