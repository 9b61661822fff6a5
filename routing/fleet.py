"""What routers derive from the two parts of the snapshot (``routing.compact``).

:class:`Fleet` is built once per members version: the hash ring (kept, or derived from
the last one, while the hosts stay or barely change), the host index and the holders
index (model -> the workers holding it warm). :class:`Measured` unpacks one compact
snapshot over a fleet: a few arrays and small aggregates, about a millisecond at 1,000
workers. :func:`policy_view` makes the routing view of both.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Mapping

from routing.compact import DRAIN_S, ranks, unpack_u8, unpack_u16
from routing.hashring import HashRing, derive
from routing.policy import PolicyView, admissions
from routing.ringorder import PATCH_MAX, changed_set
from routing.views import Holders, HostMap, Loads, Warm


@dataclass(frozen=True)
class Fleet:
    """The serving workers of one members version; per-host tuples follow ``hosts``."""

    version: str
    hosts: tuple[str, ...]
    index: Mapping[str, int] = field(repr=False)
    #: MB each worker's models may take, and each model's size in MB (as reported).
    budget_mb: tuple[int, ...] = field(repr=False)
    warm: tuple[tuple[str, ...], ...] = field(repr=False)
    ring: HashRing = field(repr=False)
    holders: Mapping[str, frozenset[str]] = field(repr=False)
    #: The budgets of all the workers summed (homes stop being assigned past it).
    capacity: int
    model_mb: Mapping[str, int] = field(default_factory=dict, repr=False)


def build_fleet(members: Mapping[str, Any], previous: Fleet | None = None) -> Fleet:
    """The fleet of a members document; ``previous``'s ring and holder sets are reused
    where they are unchanged (so orders cached on them stay valid)."""
    hosts = tuple(members["hosts"])
    budget, warm = tuple(members["budget_mb"]), tuple(tuple(m) for m in members["warm"])
    if not len(hosts) == len(budget) == len(warm):
        raise ValueError(f"members {members.get('version')}: {len(hosts)} hosts, "
                         f"{len(budget)} budgets, {len(warm)} warm sets")
    ring = derive(previous.ring if previous else None, hosts)
    return Fleet(version=members["version"], hosts=hosts,
                 index={host: i for i, host in enumerate(hosts)}, budget_mb=budget,
                 warm=warm, ring=ring, holders=_holders(hosts, warm, previous),
                 capacity=sum(max(0, b) for b in budget),
                 model_mb=dict(members.get("model_mb", {})))


def _holders(hosts: tuple[str, ...], warm: tuple[tuple[str, ...], ...],
             previous: Fleet | None) -> dict[str, frozenset[str]]:
    """model -> hosts holding it; an unchanged set is ``previous``'s very object, and
    one a few workers changed remembers how (so its kept ring orders are patched)."""
    found: dict[str, set[str]] = {}
    for host, models in zip(hosts, warm):
        for model in models:
            found.setdefault(model, set()).add(host)
    before = previous.holders if previous else {}
    return {model: _like(before.get(model), held) for model, held in found.items()}


def _like(last: frozenset[str] | None, held: set[str]) -> frozenset[str]:
    """``held``: ``last`` itself when the same, made from it when a few workers loaded
    or dropped the model, else a new set."""
    if last is None or abs(len(last) - len(held)) > PATCH_MAX:
        return frozenset(held)
    toggled = last ^ held
    if not toggled:
        return last
    return changed_set(last, frozenset(toggled)) if len(toggled) <= PATCH_MAX \
        else frozenset(held)


@dataclass(frozen=True)
class Measured:
    """One compact snapshot unpacked over its fleet (per-host lists follow its hosts)."""

    snapshot: Mapping[str, Any]
    fleet: Fleet
    loads: list[int]
    #: Seconds per queued job (a worker not measured drains like the median one);
    #: empty when no worker is measured.
    drain_s: tuple[float, ...]
    #: Jobs per second each worker finishes (0 where it has no drain time).
    rates: tuple[float, ...]
    ranks: list[int]
    cold_s: Mapping[str, float]
    #: What a fast job would wait for on each worker (``routing.compact.fast_work``);
    #: None from a beat that does not measure it (fast jobs are then placed by ``loads``).
    fast: list[int] | None = None
    #: What a first-level standard job would wait for on each worker
    #: (``routing.compact.first_work``); None from a beat that does not measure it.
    first: list[int] | None = None


def measure(compact: Mapping[str, Any], fleet: Fleet) -> Measured:
    """Unpack ``compact`` (of ``fleet``'s members version) for routing."""
    if compact.get("members") != fleet.version:
        raise ValueError(f"snapshot of members {compact.get('members')}, "
                         f"fleet of {fleet.version}")
    count = len(fleet.hosts)
    codes = unpack_u8(compact["drain"], count)
    known = sorted(code for code in codes if code)
    median = known[len(known) // 2] if known else 0
    drain = tuple(DRAIN_S[code or median] for code in codes) if known else ()
    return Measured(snapshot=compact, fleet=fleet, loads=unpack_u16(compact["loads"], count),
                    drain_s=drain, rates=tuple(1 / d for d in drain) if drain else (0.0,) * count,
                    ranks=ranks(compact, count), cold_s=dict(compact.get("cold_s", {})),
                    fast=unpack_u16(compact["fast"], count) if "fast" in compact else None,
                    first=unpack_u16(compact["first"], count) if "first" in compact else None)


def policy_view(measured: Measured, epsilon: float) -> PolicyView:
    """The routing view of a snapshot, lane fullness and homes aside."""
    snapshot, fleet, cold = measured.snapshot, measured.fleet, measured.cold_s
    lanes, policy = snapshot.get("lanes", {}), snapshot.get("policy", {})
    return PolicyView(
        at=snapshot["at"],
        overloaded=frozenset(lane for lane, state in policy.items() if state["overloaded"]),
        exhausted=frozenset(snapshot.get("exhausted", ())),
        levels=snapshot.get("levels", {}),
        retry_after_s=max(1.0, lanes.get("relaxed", {}).get("expected_wait_s", 1.0)),
        ring=fleet.ring, epsilon=epsilon,
        loads=Loads(fleet.index, measured.loads, measured.drain_s),
        fast_loads=None if measured.fast is None else
        Loads(fleet.index, measured.fast, measured.drain_s),
        first_loads=None if measured.first is None else
        Loads(fleet.index, measured.first, measured.drain_s),
        load_sum=float(sum(measured.loads)),
        warm=Warm(fleet.index, fleet.warm, measured.ranks),
        holders=Holders(fleet.holders),
        budget_mb=HostMap(fleet.index, fleet.budget_mb),
        model_mb=fleet.model_mb, largest_budget_mb=max(fleet.budget_mb, default=None),
        drain_s=HostMap(fleet.index, measured.drain_s),
        cold_s=cold, cold_default_s=sum(cold.values()) / len(cold) if cold else 0.0,
        admit=admissions(lanes),
        memory_share=float(snapshot.get("redis", {}).get("memory_share", 0.0)),
    )
