"""The consistent-hash ring of the serving workers, walked lazily.

A ring is built once per set of workers (the snapshot cache keeps it while the hosts
stay the same, and derives the next one from it when a few join or leave). Every walk
starts at a key's point and stops as soon as its caller has its answer (a model's warm
holders in ring order are kept apart: ``routing.ringorder``), so a job costs a few
steps whatever the size of the fleet, not a walk over every worker.
"""
from __future__ import annotations

import bisect
import hashlib
from array import array
from functools import cached_property, lru_cache
from typing import AbstractSet, Collection, Iterable, Iterator, Sequence

#: Points per worker on the hash ring: enough to spread models evenly.
VNODES = 64
#: A new ring is derived from the last one when at most this share of its workers
#: joined or left (inserting points one by one); past it, it is sorted afresh.
DERIVE_SHARE = 0.125


def point(key: str) -> int:
    """``key``'s point on the ring (64 bits of blake2b: the same in every process)."""
    return int.from_bytes(hashlib.blake2b(key.encode(), digest_size=8).digest(), "big")


@lru_cache(maxsize=65536)
def key_point(key: str) -> int:
    """:func:`point` of a job's key (a model, a route key), remembered: the same few
    thousand keys come back job after job."""
    return point(key)


@lru_cache(maxsize=16384)
def node_points(node: str) -> tuple[int, ...]:
    """``node``'s points, hashed once per process (a ring of 1,000 workers has 64,000)."""
    return tuple(point(f"{node}#{v}") for v in range(VNODES))


class HashRing(tuple):
    """``(points, owners)``: the sorted points and the worker owning each (the pair
    routing always used; the points an array of 64-bit numbers, so that a derived ring
    copies them in slices without touching an object per point), and lazy walks."""

    def __new__(cls, points: Iterable[int] = (), owners: Iterable[str] = ()) -> HashRing:
        if not isinstance(points, array) or points.typecode != "Q":
            points = array("Q", points)
        return super().__new__(cls, (points, tuple(owners)))

    @cached_property
    def nodes(self) -> frozenset[str]:
        """The workers on the ring."""
        return frozenset(self[1])

    def walk(self, key: str, among: AbstractSet[str] | None = None,
             points: int | None = None) -> Iterator[str]:
        """Distinct workers in ring order from ``key``'s point (lazy: a caller that stops
        after a few steps pays for a few); only those of ``among`` (skipped in C), and
        over ``points`` points of the ring at most, when given."""
        ring_points, owners = self
        size = len(ring_points)
        total = len(self.nodes) if among is None else len(among)
        if not size or not total:
            return
        start, seen = _start_of(self, key), set()
        for begin, end in _spans(start, size):
            chunk = owners[begin:end]  # a slice at a time: no index per step
            for node in chunk if among is None else filter(among.__contains__, chunk):
                if node not in seen:
                    seen.add(node)
                    yield node
                    if len(seen) == total:
                        return
            if points is not None:
                points -= end - begin
                if points <= 0:
                    return


def _start_of(ring: HashRing, key: str) -> int:
    """Where a walk from ``key``'s point starts on ``ring``: remembered per ring (a ring
    never changes once made), so a job does not bisect the points again."""
    starts = ring.__dict__.setdefault("starts", {})
    start = starts.get(key)
    if start is None:
        if len(starts) >= STARTS_KEPT:
            starts.clear()
        start = starts[key] = bisect.bisect(ring[0], key_point(key))
    return start


#: Keys whose start a ring remembers.
STARTS_KEPT = 65536


def _spans(start: int, size: int, step: int = 128) -> Iterator[tuple[int, int]]:
    """(begin, end) slices of a ring of ``size`` from ``start`` round to it again."""
    for low, high in ((start, size), (0, start)):
        for begin in range(low, high, step):
            yield begin, min(begin + step, high)


def as_ring(hash_ring: tuple[tuple[int, ...], tuple[str, ...]]) -> HashRing:
    """``hash_ring`` as a :class:`HashRing` (a plain pair is wrapped)."""
    return hash_ring if isinstance(hash_ring, HashRing) else HashRing(*hash_ring)


def ring(nodes: Iterable[str]) -> HashRing:
    """The consistent-hash ring of ``nodes``: sorted points and their owners."""
    pairs = sorted((p, node) for node in set(nodes) for p in node_points(node))
    return HashRing((p for p, _ in pairs), (n for _, n in pairs))


def derive(previous: HashRing | None, nodes: Collection[str]) -> HashRing:
    """The ring of ``nodes``, derived from ``previous`` when only a few joined or left
    (the same ring :func:`ring` builds: the points that change are found by bisection
    and the rest copied in slices, not sorted again)."""
    wanted = frozenset(nodes)
    if previous is None:
        return ring(wanted)
    gone, came = previous.nodes - wanted, wanted - previous.nodes
    if not gone and not came:
        return previous
    if len(gone) + len(came) > DERIVE_SHARE * max(len(wanted), 1):
        return ring(wanted)
    points, owners = previous
    edits = sorted([*_removals(points, owners, gone), *_insertions(points, owners, came)])
    new_points, new_owners, last = array("Q"), [], 0
    for at, removed, p, node in edits:
        new_points += points[last:at]
        new_owners += owners[last:at]
        if removed:
            last = at + 1
        else:
            new_points.append(p)
            new_owners.append(node)
            last = at
    new_points += points[last:]
    new_owners += owners[last:]
    derived = HashRing(new_points, new_owners)
    derived.__dict__["nodes"] = wanted  # known: not found again from every point
    return derived


def _removals(points: Sequence[int], owners: tuple[str, ...],
              gone: Iterable[str]) -> Iterator[tuple[int, bool, int, str]]:
    """(position, True, point, node) of each point of the ``gone`` nodes."""
    for node in gone:
        for p in node_points(node):
            at = bisect.bisect_left(points, p)
            while owners[at] != node:
                at += 1  # equal points of other owners
            yield at, True, p, node


def _insertions(points: Sequence[int], owners: tuple[str, ...],
                came: Iterable[str]) -> Iterator[tuple[int, bool, int, str]]:
    """(position before which it goes, False, point, node) of each point of the ``came``
    nodes (equal points ordered by owner, as sorting the pairs would)."""
    for node in came:
        for p in node_points(node):
            at = bisect.bisect_left(points, p)
            while at < len(points) and points[at] == p and owners[at] < node:
                at += 1
            yield at, False, p, node
