"""What routers derive from the two parts of the snapshot (``routing.compact``).

:class:`Fleet` is built once per members version, from the last one: the hash ring, the
host index and the holders index (model -> the workers holding it warm) are kept, or
patched for the workers that joined, left or loaded models (a worker joining does not
rebuild what grows with the fleet). :class:`Measured` unpacks one compact
snapshot over a fleet (and the slow figures the last one held): a few arrays
decoded in C and small aggregates. :func:`policy_view` makes the routing view of both.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from itertools import compress
from operator import ne
from typing import Any, Iterator, Mapping

from routing.compact import DRAIN_S, slice_ranks, unpack_u8, unpack_work
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
    #: The version this one was derived from with the same hosts, and the places of the
    #: hosts whose warm sets differ from it (so that what routers carry by host follows).
    derived: tuple[str, tuple[int, ...]] | None = field(default=None, repr=False)


def build_fleet(members: Mapping[str, Any], previous: Fleet | None = None) -> Fleet:
    """The fleet of a members document, derived from ``previous`` (the last version held):
    its ring, host index and holder sets are kept, or patched for the hosts that joined,
    left or changed their warm sets (so orders cached on them stay valid)."""
    hosts = tuple(members["hosts"])
    budget, warm = tuple(members["budget_mb"]), tuple(map(tuple, members["warm"]))
    if not len(hosts) == len(budget) == len(warm):
        raise ValueError(f"members {members.get('version')}: {len(hosts)} hosts, "
                         f"{len(budget)} budgets, {len(warm)} warm sets")
    same = previous is not None and previous.hosts == hosts
    index = previous.index if same else {host: i for i, host in enumerate(hosts)}
    changed = tuple(compress(range(len(hosts)), map(ne, warm, previous.warm))) if same \
        else ()
    holders = _holders_since(previous, hosts, warm, index, changed if same else None) \
        if previous is not None else _holders(hosts, warm)
    return Fleet(version=members["version"], hosts=hosts, index=index, budget_mb=budget,
                 warm=warm, ring=derive(previous.ring if previous else None, hosts),
                 holders=holders, capacity=sum(b for b in budget if b > 0),
                 model_mb=dict(members.get("model_mb", {})),
                 derived=(previous.version, changed) if same else None)


def _holders(hosts: tuple[str, ...],
             warm: tuple[tuple[str, ...], ...]) -> dict[str, frozenset[str]]:
    """model -> the hosts holding it."""
    found: dict[str, set[str]] = {}
    for host, models in zip(hosts, warm):
        for model in models:
            found.setdefault(model, set()).add(host)
    return {model: frozenset(held) for model, held in found.items()}


def _holders_since(previous: Fleet, hosts: tuple[str, ...], warm: tuple[tuple[str, ...], ...],
                   index: Mapping[str, int],
                   changed: tuple[int, ...] | None) -> dict[str, frozenset[str]]:
    """:func:`_holders` from ``previous``'s: an unchanged set is its very object, and one
    a few workers changed remembers how (``routing.ringorder.changed_set``: its kept
    ring orders are patched). ``changed``: the places of the hosts whose warm sets
    changed, when the hosts are the same; else every host is compared by name."""
    toggles: dict[str, set[str]] = {}
    for host, before, after in _changed_hosts(previous, hosts, warm, index, changed):
        for model in set(before).symmetric_difference(after):
            toggles.setdefault(model, set()).add(host)
    holders = dict(previous.holders)
    for model, toggled in toggles.items():
        last = holders.get(model)
        if last is None:
            holders[model] = frozenset(toggled)
        elif len(last ^ toggled) == 0:
            del holders[model]
        else:
            holders[model] = changed_set(last, frozenset(toggled)) \
                if len(toggled) <= PATCH_MAX else last ^ frozenset(toggled)
    return holders


def _changed_hosts(previous: Fleet, hosts: tuple[str, ...], warm: tuple[tuple[str, ...], ...],
                   index: Mapping[str, int], changed: tuple[int, ...] | None,
                   ) -> Iterator[tuple[str, tuple[str, ...], tuple[str, ...]]]:
    """(host, its warm set in ``previous``, now) of each host that joined (nothing
    before), left (nothing now) or changed its warm set."""
    if changed is not None:
        for i in changed:
            yield hosts[i], previous.warm[i], warm[i]
        return
    for host, models in zip(hosts, warm):
        was = previous.index.get(host)
        if was is None or previous.warm[was] != models:
            yield host, () if was is None else previous.warm[was], models
    for host, models in zip(previous.hosts, previous.warm):
        if host not in index:
            yield host, models, ()


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
    #: None: fast jobs are placed by ``loads``.
    fast: list[int] | None = None
    #: What a first-level standard job would wait for on each worker
    #: (``routing.compact.first_work``); None: placed by ``loads``.
    first: list[int] | None = None
    #: Each worker's drain code (0: not measured, or not heard of yet), as last carried.
    codes: bytes = b""


def measure(compact: Mapping[str, Any], fleet: Fleet,
            previous: Measured | None = None) -> Measured:
    """Unpack ``compact`` (of ``fleet``'s members version) for routing: its work figures,
    and the slow ones of its slice over those ``previous`` held (by host)."""
    if compact.get("members") != fleet.version:
        raise ValueError(f"snapshot of members {compact.get('members')}, "
                         f"fleet of {fleet.version}")
    count = len(fleet.hosts)
    loads, fast, first = unpack_work(compact, count)
    codes, order = _carried(fleet, previous)
    start, stop = compact["slice"]
    if not 0 <= start <= stop <= count:
        raise ValueError(f"slice {start}:{stop} of {count} hosts")
    codes[start:stop] = unpack_u8(compact["drain"], stop - start)
    order[start:stop] = slice_ranks(compact)
    if previous is not None and previous.codes == codes:
        drain, rates = previous.drain_s, previous.rates  # the common case: none changed
    else:
        drain, rates = _drains(bytes(codes))
    return Measured(snapshot=compact, fleet=fleet, loads=loads, drain_s=drain, rates=rates,
                    ranks=order, cold_s=dict(compact.get("cold_s", {})), fast=fast,
                    first=first, codes=bytes(codes))


def _carried(fleet: Fleet, previous: Measured | None) -> tuple[bytearray, list[int]]:
    """The drain codes and orders ``previous`` held for ``fleet``'s hosts (an order only
    where the host's warm set is the same); none known elsewhere."""
    if previous is None:
        return bytearray(len(fleet.hosts)), [0] * len(fleet.hosts)
    if previous.fleet is fleet:
        return bytearray(previous.codes), list(previous.ranks)
    if fleet.derived is not None and fleet.derived[0] == previous.fleet.version:
        order = list(previous.ranks)  # the same hosts: orders but of the changed warm sets
        for i in fleet.derived[1]:
            order[i] = 0
        return bytearray(previous.codes), order
    before, codes, order = previous.fleet, bytearray(len(fleet.hosts)), [0] * len(fleet.hosts)
    for i, host in enumerate(fleet.hosts):
        was = before.index.get(host)
        if was is not None:
            codes[i] = previous.codes[was]
            order[i] = previous.ranks[was] if before.warm[was] == fleet.warm[i] else 0
    return codes, order


def _drains(codes: bytes) -> tuple[tuple[float, ...], tuple[float, ...]]:
    """(seconds per queued job, jobs per second) of each drain code; a host not measured
    drains like the median measured one; empty (and no rates) when none is."""
    unknown = codes.count(0)
    if unknown == len(codes):
        return (), (0.0,) * len(codes)
    median = sorted(codes)[unknown + (len(codes) - unknown) // 2]
    seconds = (DRAIN_S[median], *DRAIN_S[1:])
    return (tuple(map(seconds.__getitem__, codes)),
            tuple(map(RATES[median].__getitem__, codes)))


#: Jobs per second of each drain code, with 0 read as code ``m`` (``RATES[m]``).
RATES = tuple((1 / DRAIN_S[m] if m else 0.0, *(1 / s for s in DRAIN_S[1:])) for m in range(256))


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
