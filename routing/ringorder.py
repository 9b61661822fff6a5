"""A model's warm holders in ring order from a job's point, kept as the set changes.

Bounded-load hashing sends a job to the first of its model's warm holders, in ring
order from the job's point, that is under the load cap. A hot model is warm on
hundreds of workers at scale, and this process's own sends change that set all the
time (a cold load somewhere evicts it there). So the order is kept per key (a model,
or a model and route key), whatever the ring (it depends on the workers' points only),
and patched rather than sorted again: a set made from another by :func:`changed_set`
remembers how (:class:`Held`), and a patched order remembers how much of its start
it shares with the one it came from (:class:`Order`), so that the run of busy holders
found for it (``routing.views.Loads.first_below``) is not read again.
"""
from __future__ import annotations

import bisect
from functools import lru_cache
from typing import Iterable, Mapping, NamedTuple, Sequence

from routing.hashring import VNODES, key_point, node_points

#: Keys whose last ring order of holders is kept.
ORDERS_KEPT = 4096
#: A kept order is patched when at most this many workers joined or left the set.
PATCH_MAX = 16
#: Steps of lineage a set or an order keeps (so that old ones are let go).
LINEAGE = 16
_MASK = (1 << 64) - 1
_NOTHING: frozenset[str] = frozenset()


class Held(frozenset):
    """Holders made from ``parent`` by toggling the workers of ``changed``."""

    __slots__ = ("parent", "changed", "depth")


def changed_set(held: frozenset[str], toggled: frozenset[str]) -> frozenset[str]:
    """``held`` with the workers of ``toggled`` put in or taken out, remembering how."""
    made = Held(held ^ toggled)
    depth = getattr(held, "depth", 0) + 1
    if depth > LINEAGE:
        made.parent, made.changed, made.depth = None, _NOTHING, 0
    else:
        made.parent, made.changed, made.depth = held, toggled, depth
    return made


def _toggled_since(held: frozenset[str], ancestor: frozenset[str]) -> frozenset[str] | None:
    """What changed from ``ancestor`` to ``held`` along the lineage; None if unknown."""
    toggled: frozenset[str] = _NOTHING
    for _ in range(LINEAGE + 1):
        if held is ancestor:
            return toggled
        parent = getattr(held, "parent", None)
        if parent is None:
            return None
        toggled, held = toggled ^ held.changed, parent
    return None


class Order(list):
    """Workers in ring order, never changed once made (a list: a patch copies it once
    and inserts in place); ``parent``: the order it was patched from, the first
    ``same`` of which it shares."""

    parent: Order | None = None
    same = 0
    depth = 0


def common_prefix(order: Sequence[str], ancestor: Sequence[str]) -> int | None:
    """How many first workers ``order`` shares with ``ancestor`` (known through the
    patches between them); None when ``ancestor`` is not in its lineage."""
    shared = len(order)
    for _ in range(LINEAGE + 1):
        if order is ancestor:
            return shared
        parent = getattr(order, "parent", None)
        if parent is None:
            return None
        shared, order = min(shared, order.same), parent
    return None


@lru_cache(maxsize=16384)
def _sorted_points(node: str) -> tuple[int, ...]:
    return tuple(sorted(node_points(node)))


def _distances(nodes: Iterable[str], from_point: int) -> list[tuple[int, str]]:
    """(how far round the ring from ``from_point`` a walk first meets the node, node),
    sorted: the order of ``HashRing.walk`` on any ring that holds them (equal points
    by owner, as the ring sorts them)."""
    after = from_point + 1
    return sorted((((points[at] if (at := bisect.bisect(points := _sorted_points(node),
                                                       from_point)) < VNODES
                     else points[0]) - after) & _MASK, node) for node in nodes)


class _Kept(NamedTuple):
    held: frozenset[str]
    order: Order
    #: Each worker's distance (see :func:`_distances`), in the same order.
    distances: list[int]


_KEPT: dict[str, _Kept] = {}
#: key -> (when it was last asked for: the count of asks then, its model, how many
#: times since the last order_asked())
_ASKED: dict[str, tuple[int, str, int]] = {}
_ASKS = [0]
_ORDERED = [0]  # the count of asks at the last order_asked()
#: Holders an order_asked() puts in order at most (a bisect each: a millisecond or so).
ORDER_ASKED_HOLDERS = 1024


def ask(key: str, model: str) -> None:
    """Count an ask for ``key``'s order (of ``model``'s holders), for :func:`order_asked`."""
    _ASKS[0] += 1
    if len(_ASKED) >= ORDERS_KEPT:
        _ASKED.clear()
    last = _ASKED.get(key)
    times = last[2] + 1 if last is not None and last[0] > _ORDERED[0] else 1
    _ASKED[key] = (_ASKS[0], model, times)


def order_asked(holders: Mapping[str, frozenset[str]]) -> None:
    """Put in order, as they are now, the holders of the keys asked for since the last
    call that are not kept so (a new key, or one whose set changed much), the most
    asked first, ``ORDER_ASKED_HOLDERS`` at most: the snapshot cache calls it after each
    snapshot, off the jobs' path, so that a job finds the order of a widely held model
    kept or a patch away instead of walking for it."""
    since, spent = _ORDERED[0], 0
    _ORDERED[0] = _ASKS[0]
    asked = sorted(((times, key, model) for key, (at, model, times) in list(_ASKED.items())
                    if at > since), reverse=True)
    for _, key, model in asked:
        held = holders.get(model)
        if not held or kept_order(held, key) is not None:
            continue
        in_ring_order(held, key)
        spent += len(held)
        if spent >= ORDER_ASKED_HOLDERS:
            return


def in_ring_order(held: frozenset[str], key: str) -> Sequence[str]:
    """The workers of ``held`` in the order a walk from ``key``'s point meets them:
    kept, or a patch away (:func:`kept_order`), else computed (a bisect per holder)."""
    order = kept_order(held, key)
    if order is None:
        pairs = _distances(held, key_point(key))
        order = _keep(key, _Kept(held, Order(node for _, node in pairs),
                                 [distance for distance, _ in pairs]))
    return order


def kept_order(held: frozenset[str], key: str) -> Sequence[str] | None:
    """:func:`in_ring_order` if it is kept for ``key`` or a patch away; else None."""
    kept = _KEPT.get(key)
    if kept is None:
        return None
    if kept.held is held:
        return kept.order
    toggled = _toggled_since(held, kept.held)
    if toggled is None and abs(len(kept.held) - len(held)) <= PATCH_MAX:
        toggled = kept.held ^ held  # a new membership: compared once per key
    if toggled is None or len(toggled) > PATCH_MAX:
        return None
    return _keep(key, _patched(kept, held, toggled, key_point(key)))


def _keep(key: str, made: _Kept) -> Order:
    if len(_KEPT) >= ORDERS_KEPT:
        _KEPT.clear()  # rare: more keys than kept; they are found again as they come
    _KEPT[key] = made
    return made.order


def _patched(kept: _Kept, held: frozenset[str], toggled: frozenset[str],
             from_point: int) -> _Kept:
    """``kept`` with the workers of ``toggled`` put in or taken out (copies: a reader in
    another thread may hold the kept one)."""
    order, distances, same = Order(kept.order), kept.distances.copy(), len(kept.order)
    for distance, node in _distances(toggled, from_point):
        at = bisect.bisect_left(distances, distance)
        while at < len(order) and distances[at] == distance and order[at] < node:
            at += 1  # equal distances (equal points): by owner, as the ring sorts them
        if node in held:
            order.insert(at, node)
            distances.insert(at, distance)
        else:
            del order[at], distances[at]
        same = min(same, at)
    if kept.order.depth < LINEAGE:
        order.parent, order.same, order.depth = kept.order, same, kept.order.depth + 1
    return _Kept(held, order, distances)
