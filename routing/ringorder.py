"""A model's warm holders in ring order from a job's point, kept as the set changes.

Bounded-load hashing sends a job to the first of its model's warm holders, in ring
order from the job's point, that is under the load cap. A hot model is warm on
hundreds of workers at scale, and this process's own sends change that set all the
time (a cold load somewhere evicts it there). So the order is kept per key (a model,
or a model and route key), whatever the ring (it depends on the workers' points only),
and patched rather than sorted again: a set made from another by :func:`changed_set`
remembers how (:class:`Held`: two sets of one lineage compare in a few steps), and a
patched order where workers came in or left (:class:`Order`), so that the run of busy
holders found for it (``routing.views.Loads.first_below``) is not read again.
"""
from __future__ import annotations

import bisect
from functools import lru_cache
from typing import Iterable, Iterator, Mapping, NamedTuple, Sequence

from routing.hashring import VNODES, key_point, node_points

#: Keys whose last ring order of holders is kept.
ORDERS_KEPT = 4096
#: A kept order is patched when at most this many workers joined or left the set.
PATCH_MAX = 16
#: Steps of lineage a set or an order keeps (so that old ones are let go).
LINEAGE = 16
#: A set made from another is measured from that one's root while they differ by at
#: most this many workers (so that two sets of one lineage compare in a few steps).
ROOT_DELTA = 64
_MASK = (1 << 64) - 1
_NOTHING: frozenset[str] = frozenset()


class Held(frozenset):
    """Holders made by toggling workers in or out of another set: ``delta`` is what
    differs from ``root`` (the set it was made from, or that one's root while the
    difference stays small), ``hops`` how many roots lead back from it."""

    __slots__ = ("root", "delta", "hops")


def changed_set(held: frozenset[str], toggled: frozenset[str]) -> frozenset[str]:
    """``held`` with the workers of ``toggled`` put in or taken out, remembering how."""
    made = Held(held ^ toggled)
    root, delta = getattr(held, "root", None), getattr(held, "delta", _NOTHING) ^ toggled
    if root is None or len(delta) > ROOT_DELTA:
        root, delta = held, toggled
    hops = getattr(root, "hops", 0) + 1
    if hops > LINEAGE:  # let the oldest sets go
        root, delta, hops = None, _NOTHING, 0
    made.root, made.delta, made.hops = root, delta, hops
    return made


def _lineage(held: frozenset[str]) -> Iterator[tuple[frozenset[str], frozenset[str]]]:
    """(each set ``held`` was made from, by roots, and what differs between them)."""
    toggled: frozenset[str] = _NOTHING
    for _ in range(LINEAGE + 1):
        yield held, toggled
        root = getattr(held, "root", None)
        if root is None:
            return
        toggled, held = toggled ^ held.delta, root


def _toggled_between(held: frozenset[str], other: frozenset[str]) -> frozenset[str] | None:
    """What differs between two sets made from a common one (through their roots);
    None if they share none."""
    seen = {id(made): (made, toggled) for made, toggled in _lineage(other)}
    for made, toggled in _lineage(held):
        found = seen.get(id(made))
        if found is not None and found[0] is made:
            return toggled ^ found[1]
    return None


class Order(list):
    """Workers in ring order, never changed once made (a list: a patch copies it once
    and inserts in place); ``parent``: the order it was patched from, and ``moves``
    how: (position, whether a worker came in there or left), in turn."""

    parent: Order | None = None
    moves: tuple[tuple[int, bool], ...] = ()
    depth = 0


def carried_prefix(order: Sequence[str], ancestor: Sequence[str], busy: int,
                   fresh: Sequence[int] = ()) -> tuple[int, list[int]] | None:
    """What the first ``busy`` workers of ``ancestor`` are in ``order`` (through the
    patches between them): how many first workers of ``order`` they and the ones that
    came in among them make, and the positions of those that came in and of ``fresh``
    (positions in ``ancestor``: to be read afresh), ascending; None when ``ancestor`` is
    not in its lineage."""
    patches = []
    while order is not ancestor:
        if len(patches) > LINEAGE or getattr(order, "parent", None) is None:
            return None
        patches.append(order)
        order = order.parent
    fresh = list(fresh)
    for patch in reversed(patches):
        for at, came in patch.moves:
            if at >= busy:
                continue
            if came:
                fresh = [p + (p >= at) for p in fresh] + [at]
                busy += 1
            else:
                fresh = [p - (p > at) for p in fresh if p != at]
                busy -= 1
    return busy, sorted(fresh)


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
#: Holders an order_asked() puts in order, or patches in, at most (a bisect each: a
#: millisecond or so).
ORDER_ASKED_HOLDERS = 1024
#: order_asked() patches a kept order when at most this share of its workers changed
#: (this process's sends in one heartbeat), rather than putting them all in order again.
PATCH_SHARE = 4


def forget() -> None:
    """Drop every kept order and count of asks: this process routes for another fleet
    from now on (its kept orders would only be compared with the new sets, and fail)."""
    _KEPT.clear()
    _ASKED.clear()
    _ORDERED[0] = _ASKS[0]


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
    call that are not kept so (a new key, or one whose set changed: patched when up to
    ``PATCH_SHARE`` of it did), the most asked first, ``ORDER_ASKED_HOLDERS`` at most
    (a key of more holders than are left is passed over): the snapshot cache calls it after each
    snapshot, off the jobs' path, so that a job finds the order of a widely held model
    kept or a patch away instead of walking for it."""
    since, spent = _ORDERED[0], 0
    _ORDERED[0] = _ASKS[0]
    asked = sorted(((times, key, model) for key, (at, model, times) in list(_ASKED.items())
                    if at > since), reverse=True)
    for _, key, model in asked:
        held = holders.get(model)
        if not held:
            continue
        toggled = _toggles(key, held, max(PATCH_MAX, len(held) // PATCH_SHARE))
        if toggled is None:
            if len(held) > ORDER_ASKED_HOLDERS - spent:
                continue  # more than is left: a job walks for it, or orders it
            in_ring_order(held, key)
            spent += len(held)
        elif toggled:
            _keep(key, _patched(_KEPT[key], held, toggled, key_point(key)))
            spent += len(toggled)
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


def kept_order(held: frozenset[str], key: str, most: int = PATCH_MAX) -> Sequence[str] | None:
    """:func:`in_ring_order` if it is kept for ``key`` or a patch of at most ``most``
    workers away; else None."""
    kept = _KEPT.get(key)
    if kept is not None and kept.held is held:
        return kept.order
    toggled = _toggles(key, held, most)
    if toggled is None:
        return None
    return _keep(key, _patched(kept, held, toggled, key_point(key)))


def follow(key: str, held: frozenset[str]) -> None:
    """Patch the order kept for ``key`` to ``held`` if it is a few workers away: this
    process's send changed the set, and the next job of the key finds it in order."""
    if key in _KEPT:
        kept_order(held, key)


def _toggles(key: str, held: frozenset[str], most: int) -> frozenset[str] | None:
    """The workers that joined or left ``held`` since the order kept for ``key`` was
    made, when there are at most ``most``; None if more, or none is kept."""
    kept = _KEPT.get(key)
    if kept is None:
        return None
    if kept.held is held:
        return _NOTHING
    toggled = _toggled_between(held, kept.held)
    if toggled is None and abs(len(kept.held) - len(held)) <= most:
        toggled = kept.held ^ held  # a new membership: compared once per key
    return None if toggled is None or len(toggled) > most else toggled


def _keep(key: str, made: _Kept) -> Order:
    if len(_KEPT) >= ORDERS_KEPT:
        _KEPT.clear()  # rare: more keys than kept; they are found again as they come
    _KEPT[key] = made
    return made.order


def _patched(kept: _Kept, held: frozenset[str], toggled: frozenset[str],
             from_point: int) -> _Kept:
    """``kept`` with the workers of ``toggled`` put in or taken out (copies: a reader in
    another thread may hold the kept one)."""
    order, distances, moves = Order(kept.order), kept.distances.copy(), []
    for distance, node in _distances(toggled, from_point):
        at = bisect.bisect_left(distances, distance)
        while at < len(order) and distances[at] == distance and order[at] < node:
            at += 1  # equal distances (equal points): by owner, as the ring sorts them
        if node in held:
            order.insert(at, node)
            distances.insert(at, distance)
        else:
            del order[at], distances[at]
        moves.append((at, node in held))
    if kept.order.depth < LINEAGE:
        order.parent, order.moves, order.depth = kept.order, tuple(moves), kept.order.depth + 1
    return _Kept(held, order, distances)
