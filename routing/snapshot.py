"""The submitting process's copy of the cluster snapshot, refreshed in the background.

``submit()`` routes from this copy: a new process's first view reads it in the
caller (its first burst is routed from beat's word, not by tier alone), then a
daemon thread re-reads the snapshot that beat writes every heartbeat. When
the copy is older than ``stale_s`` (beat down, Redis unreachable) routing
falls back to plain tier lanes and says so in the log, once per episode.

The snapshot comes in two parts (``routing.compact``): a few kB read every time, and
the membership (hosts, memory budgets, warm sets, model sizes), read through
``fetch_members`` only when its version changes. What grows with the fleet is derived
once per version (``routing.fleet``); a snapshot of the same membership only unpacks a
few arrays; a view is O(1) to make and a job looks at the few workers it needs.
"""
from __future__ import annotations

import json
import logging
import os
import threading
import time
import zlib
from collections import deque
from dataclasses import dataclass, replace
from typing import Any, Callable, Mapping

from routing.compact import split
from routing.fleet import Fleet, Measured, build_fleet, measure, policy_view
from routing.fluid import Draining
from routing.names import FAST, LANES
from routing.placement import assign_homes, touched
from routing.policy import ADMIT_HOLD_SHARE, Admission, PolicyView
from routing.ringorder import changed_set, follow, order_asked

log = logging.getLogger(__name__)
#: Jobs over which a router measures each model's demand.
DEMAND_WINDOW = 1000
#: What a snapshot that cannot be applied raises (kept out: the last copy stays).
UNREADABLE = (ValueError, KeyError, TypeError, IndexError, zlib.error)


def _parts(snapshot: dict) -> tuple[dict, dict | None]:
    """(compact, members or None): a full snapshot (with ``workers``: tests, an older
    beat; or with no ``members`` version at all) is split here."""
    if "workers" in snapshot or "members" not in snapshot:
        return split(snapshot)
    return snapshot, None


def base_view(snapshot: dict, epsilon: float = 0.25) -> PolicyView:
    """The routing view of a full snapshot, lane fullness aside."""
    compact, members = split(snapshot)
    return policy_view(measure(compact, build_fleet(members)), epsilon)


def full_lanes(snapshot: Mapping[str, Any], sent: Mapping[str, int],
               max_depth: Mapping[str, int]) -> frozenset[str]:
    """Lanes at their maximum depth, counting jobs this process sent since the snapshot."""
    lanes = snapshot.get("lanes", {})
    return frozenset(lane for lane in LANES
                     if lanes.get(lane, {}).get("depth", 0) + sent.get(lane, 0)
                     >= max_depth[lane])


def _plus(counts: dict[str, int], node: str, own: bool) -> dict[str, int]:
    """``counts`` with one more for ``node``: changed in place when ``own``, else copied
    (views handed out read the one they were given)."""
    counts = counts if own else dict(counts)
    counts[node] = counts.get(node, 0) + 1
    return counts


_NOBODY: frozenset[str] = frozenset()


@dataclass(frozen=True)
class _Held:
    """The snapshot routed from (compact form), its base view (with homes), unpacked."""

    snapshot: Mapping[str, Any]
    base: PolicyView
    measured: Measured


class SnapshotCache:
    """Holds the latest snapshot; ``view()`` is an in-memory read.

    ``fetch_members(version)``: the raw JSON of that members document (None when it
    is not there); without it only full snapshots can be applied.
    """

    def __init__(self, fetch: Callable[[], str | None], refresh_s: float, stale_s: float,
                 max_depth: Mapping[str, int], clock: Callable[[], float] = time.time,
                 epsilon: float = 0.25,
                 fetch_members: Callable[[str], str | bytes | None] | None = None) -> None:
        self.fetch, self.refresh_s, self.stale_s = fetch, refresh_s, stale_s
        self.max_depth, self.clock, self.epsilon = dict(max_depth), clock, epsilon
        self.fetch_members = fetch_members
        # swapped whole by refresh() under the lock
        self._state: _Held | None = None
        # the members version held: kept across snapshots, and across forget() (a
        # version names its content)
        self._fleet: Fleet | None = None
        # Jobs this process sent that the snapshot may not count yet:
        # (time, lane, worker or None, model), their totals per lane, and what
        # they did to each worker: jobs added (and to the fleet's total, as it
        # drains), models made warm or evicted. The dicts are replaced whole (never
        # changed in place): views handed out read them unlocked.
        self._log: deque[tuple[float, str, str | None, str, bool]] = deque()
        self._sent: dict[str, int] = {}
        self._node_sent: dict[str, int] = {}
        self._sends = 0  # counted in _node_sent since the snapshot
        self._node_fast_sent: dict[str, int] = {}  # of them, fast jobs
        self._node_first_sent: dict[str, int] = {}  # ... fast and first-level standard
        self._warm_after: dict[str, tuple[str, ...]] = {}
        self._holders_after: dict[str, frozenset[str]] = {}
        self._fluid = Draining((), ())
        # The models of the last DEMAND_WINDOW jobs routed, and counts of each:
        # each snapshot assigns homes from them, most wanted first.
        self._recent: deque[str] = deque()
        self._demand: dict[str, int] = {}
        #: (members version, wanted models) the homes were last assigned for.
        self._homed: tuple[str, frozenset[str]] | None = None
        # Lanes a publish found at their maximum depth (``note_full``) -> when: full
        # until a snapshot measured later arrives, or for one heartbeat at most.
        self._refused: dict[str, float] = {}
        self._shut: dict[str, float] = {}  # lane -> when it opens again
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None
        self._warned = False
        os.register_at_fork(after_in_child=self._forget_thread)

    def forget(self) -> None:
        """Drop the copy, every send counted against it and the demand seen, then
        read afresh (after the snapshot in Redis was deleted: a new cluster, a
        flushed test Redis)."""
        with self._lock:
            self._state, self._sent, self._node_sent = None, {}, {}
            self._node_fast_sent, self._node_first_sent = {}, {}
            self._warm_after, self._holders_after = {}, {}
            self._demand, self._refused, self._shut = {}, {}, {}
            self._log.clear()
            self._recent.clear()
        self.refresh()

    def _forget_thread(self) -> None:
        self._thread, self._lock = None, threading.Lock()

    def refresh(self) -> None:
        """Read the snapshot once; keep the old copy if Redis cannot answer, or the
        members of a new version cannot be read (tried again next time)."""
        try:
            raw = self.fetch()
        except Exception as exc:  # noqa: BLE001  the router must keep working
            log.debug("snapshot refresh failed: %s", exc)
            return
        if not raw:
            return
        try:
            snapshot = json.loads(raw)
            held = self._state
            if held is not None and snapshot["at"] == held.snapshot["at"]:
                return
            measured = self._measure(snapshot)
        except UNREADABLE as exc:
            log.debug("snapshot not applied: %r", exc)
            return
        if measured is not None:
            with self._lock:
                self._apply(measured)
                holders = self._state.base.holders.sent(self._holders_after)
            order_asked(holders)  # the ring orders the next jobs want (outside the lock)

    def _measure(self, snapshot: dict) -> Measured | None:
        """The snapshot unpacked over its members (built once per version; outside the
        lock: routing goes on from the last copy meanwhile); None: members unreadable."""
        compact, members = _parts(snapshot)
        fleet = self._fleet
        if fleet is None or fleet.version != compact["members"]:
            members = members or self._read_members(compact["members"])
            if members is None:
                return None
            fleet = self._fleet = build_fleet(members, fleet)
        return measure(compact, fleet, self._state.measured if self._state else None)

    def _read_members(self, version: str) -> dict | None:
        if self.fetch_members is None:
            log.debug("snapshot of members %s, and no way to read them", version)
            return None
        try:
            raw = self.fetch_members(version)
        except Exception as exc:  # noqa: BLE001  the router must keep working
            log.debug("members %s not read: %s", version, exc)
            return None
        members = json.loads(raw) if raw else None
        return members if members and members.get("version") == version else None

    def _apply(self, measured: Measured) -> None:
        """Route from ``measured`` from now on (caller holds the lock)."""
        previous = self._state.base.homes if self._state else None
        snapshot = measured.snapshot
        self._state = _Held(snapshot, policy_view(measured, self.epsilon), measured)
        if previous is not None and self._homed == (measured.fleet.version,
                                                    frozenset(self._demand)):
            # homes follow the members and the wanted models only: once per version
            self._state = replace(self._state, base=self._state.base.but(homes=previous))
        else:
            self._rehome(previous)
        measured_at = snapshot.get("measured_at", snapshot["at"])
        self._forget_sent_before(measured_at)
        self._refused = {lane: at for lane, at in self._refused.items() if at >= measured_at}
        self._replay()

    def _loop(self) -> None:
        while True:
            self.refresh()
            time.sleep(self.refresh_s)

    def start(self) -> None:
        """First call: read once in the caller (so a new process starts informed), then
        keep refreshing in a daemon thread."""
        if self._thread is None:
            self.refresh()
            self._thread = threading.Thread(target=self._loop, name="gpulanes-snapshot",
                                            daemon=True)
            self._thread.start()

    def _forget_sent_before(self, measured_at: float) -> None:
        while self._log and self._log[0][0] < measured_at:
            lane = self._log.popleft()[1]
            self._sent[lane] -= 1

    def _rehome(self, previous: Mapping[str, str] | None) -> None:
        """Give the wanted models homes on the current workers (caller holds the lock):
        O(wanted models), a step or two each while they keep their homes."""
        held = self._state
        wanted = sorted((m for m, n in self._demand.items() if n),
                        key=lambda m: (-self._demand[m], m))
        fleet = held.measured.fleet
        homes = assign_homes(wanted, held.base.ring, held.base.budget_mb, previous,
                             capacity=fleet.capacity, sizes=fleet.model_mb)
        self._state = replace(held, base=held.base.but(homes=homes))
        self._homed = (held.measured.fleet.version, frozenset(wanted))

    def _replay(self) -> None:
        """The new snapshot's workers, with the sends it did not see applied again (the
        overlays are new: changed in place, and each holder set made once)."""
        measured = self._state.measured
        self._node_sent, self._warm_after = {}, {}
        self._node_fast_sent, self._node_first_sent = {}, {}
        self._sends, self._fluid = 0, Draining(measured.loads, measured.rates)
        toggles: dict[str, set[str]] = {}
        for _, lane, node, model, first in self._log:
            self._count(lane, node, model, first, toggles)
        base = measured.fleet.holders
        # made from the members' sets: orders kept for the last ones are patched from
        # them through their common root (``routing.ringorder.changed_set``)
        self._holders_after = {model: changed_set(base.get(model, _NOBODY), frozenset(nodes))
                               for model, nodes in toggles.items() if nodes}

    def _count(self, lane: str, node: str | None, model: str, first: bool = False,
               toggles: dict[str, set[str]] | None = None) -> None:
        """A send to ``node``'s own queue of ``lane``, of ``model`` (``first``: a
        first-level standard job): its load (and its fast and first-level loads), and
        the model warm there. ``toggles``: a replay's (model -> workers it came to or
        left), the overlays its own."""
        held = self._state
        i = None if node is None else held.measured.fleet.index.get(node)
        if i is None:
            return
        own = toggles is not None
        self._node_sent = _plus(self._node_sent, node, own)
        self._sends += 1
        if lane == FAST:
            self._node_fast_sent = _plus(self._node_fast_sent, node, own)
        if lane == FAST or first:
            self._node_first_sent = _plus(self._node_first_sent, node, own)
        self._fluid.add(i)
        before = self._warm_after.get(node)
        if before is not None and before[-1] == model:
            return  # what touched() made, with the model already last: it stays so
        before = before or held.base.warm[node]
        fleet = held.measured.fleet
        after = touched(before, model, fleet.budget_mb[i], fleet.model_mb)
        if own:
            self._warm_after[node] = after
        else:
            self._warm_after = {**self._warm_after, node: after}
        if set(before) != set(after):
            if toggles is None:
                self._holders_after = self._moved(node, before, after)
            else:
                for moved in set(before).symmetric_difference(after):
                    toggles.setdefault(moved, set()).symmetric_difference_update((node,))

    def _moved(self, node: str, before: tuple[str, ...],
               after: tuple[str, ...]) -> dict[str, frozenset[str]]:
        """The holders overlay once ``node`` went from ``before`` to ``after``."""
        changed, base = dict(self._holders_after), self._state.measured.fleet.holders
        for model in set(before).symmetric_difference(after):
            held = changed.get(model, base.get(model, frozenset()))
            changed[model] = changed_set(held, frozenset((node,)))
            follow(model, changed[model])
        return changed

    def note_sent(self, lane: str, node: str | None = None, model: str = "",
                  first: bool = False) -> None:
        """Count a job sent to ``lane`` (``node``'s own queue of it, for ``model``;
        ``first``: a first-level standard job) until a snapshot measured after it: the
        lane's depth, the worker's load, and the model it will make warm there."""
        with self._lock:
            now = self.clock()
            # a send older than stale_s predates any snapshot this router may still
            # route from: drop it now, or with beat down the log grows without end
            self._forget_sent_before(now - self.stale_s)
            self._log.append((now, lane, node, model, first))
            self._sent[lane] = self._sent.get(lane, 0) + 1
            if self._state is not None:
                self._count(lane, node, model, first)
            self._recent.append(model)
            self._demand[model] = self._demand.get(model, 0) + 1
            if len(self._recent) > DEMAND_WINDOW:
                gone = self._recent.popleft()
                self._demand[gone] -= 1
                if not self._demand[gone]:  # out of the window: not wanted any more
                    del self._demand[gone]
            if self._demand.get(model) == 1 and self._state is not None:
                # newly wanted: home it now (a model left without a home, all budgets
                # taken, is not re-tried on every send; the next snapshot re-homes)
                self._rehome(self._state.base.homes)

    def note_full(self, lane: str) -> None:
        """A publish found ``lane`` at its maximum depth: route as if it is full
        until a snapshot measured after now (or one heartbeat: ``2 * refresh_s``)."""
        with self._lock:
            self._refused = {**self._refused, lane: self.clock()}

    def refused(self) -> frozenset[str]:
        """Lanes held full since a publish found them so (see ``note_full``)."""
        since = self.clock() - 2 * self.refresh_s
        return frozenset(lane for lane, at in self._refused.items() if at >= since)

    def note_over_budget(self, lane: str, admission: Admission) -> None:
        """A publish found ``lane`` past its ``admission``: shut it to this process's jobs
        that may move down for ``ADMIT_HOLD_SHARE`` of the admission's wait."""
        with self._lock:
            self._shut = {**self._shut,
                          lane: self.clock() + ADMIT_HOLD_SHARE * admission.wait_s}

    def shut(self) -> frozenset[str]:
        """Lanes shut since a publish found them past their admission."""
        now = self.clock()
        return frozenset(lane for lane, until in self._shut.items() if until > now)

    def members(self) -> PolicyView | None:
        """The fresh snapshot's view as applied, without this process's sends since
        (what changes only as workers join, leave or load models), or None."""
        self.start()
        held = self._state
        if held is None or self.clock() - held.snapshot["at"] > self.stale_s:
            return None
        return held.base

    def view(self) -> PolicyView | None:
        """The current view, or None when there is no fresh snapshot."""
        self.start()
        now = self.clock()
        with self._lock:
            held = self._state
            age_s = None if held is None else now - held.snapshot["at"]
            if age_s is not None and age_s <= self.stale_s:
                snapshot = held.snapshot
                elapsed_s = max(0.0, now - snapshot.get("measured_at", snapshot["at"]))
                load_sum = self._fluid.at(elapsed_s)
                sent, node_sent, sends = self._sent, self._node_sent, self._sends
                fast_sent, first_sent = self._node_fast_sent, self._node_first_sent
                warm_after, holders_after = self._warm_after, self._holders_after
        if age_s is None or age_s > self.stale_s:
            if not self._warned:
                log.warning("no fresh lane snapshot (age %s s): routing by tier only",
                            "n/a" if age_s is None else f"{age_s:.0f}")
                self._warned = True
            return None
        self._warned = False
        base, fast, first = held.base, held.base.fast_loads, held.base.first_loads
        return base.but(full=full_lanes(snapshot, sent, self.max_depth),
                        loads=base.loads.at(node_sent, elapsed_s, sends), load_sum=load_sum,
                        fast_loads=None if fast is None else fast.at(fast_sent, elapsed_s, sends),
                        first_loads=None if first is None else
                        first.at(first_sent, elapsed_s, sends),
                        warm=base.warm.sent(warm_after),
                        holders=base.holders.sent(holders_after))
