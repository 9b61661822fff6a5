"""The submitting process's copy of the cluster snapshot, refreshed in the background.

``submit()`` routes from this copy and never waits on the network for it. A
daemon thread re-reads the snapshot that beat writes every heartbeat. When
the copy is older than ``stale_s`` (beat down, Redis unreachable) routing
falls back to plain tier lanes and says so in the log, once per episode.
"""
from __future__ import annotations

import json
import logging
import os
import threading
import time
from collections import deque
from dataclasses import replace
from typing import Callable, Mapping

from routing.names import LANES
from routing.placement import assign_homes, ring, serving
from routing.policy import PolicyView

log = logging.getLogger(__name__)
#: Jobs over which a router measures each model's demand.
DEMAND_WINDOW = 1000


def _drain_s(worker: dict) -> float | None:
    """Seconds per queued job on ``worker``: its mean service time over its concurrency."""
    samples = [ms for ms in worker.get("service_ms", {}).values() if ms]
    return sum(samples) / len(samples) / 1000 / worker.get("concurrency", 1) if samples else None


def _cold_s(workers: Mapping[str, dict]) -> dict[str, float]:
    """Mean measured load seconds per model over the workers that loaded it."""
    samples: dict[str, list[float]] = {}
    for worker in workers.values():
        for model, load_ms in worker.get("load_ms", {}).items():
            samples.setdefault(model, []).append(load_ms / 1000)
    return {model: sum(s) / len(s) for model, s in samples.items()}


def base_view(snapshot: dict, epsilon: float = 0.25) -> PolicyView:
    """The routing view of a snapshot, lane fullness aside (built once per snapshot)."""
    lanes, policy = snapshot.get("lanes", {}), snapshot.get("policy", {})
    # a sick worker (alive, but stepped aside) takes no jobs: off the ring, no capacity
    routable = {host: w for host, w in snapshot.get("workers", {}).items() if serving(w)}
    drain = {host: d for host, w in routable.items() if (d := _drain_s(w)) is not None}
    known = sorted(drain.values())
    cold = _cold_s(routable)
    return PolicyView(
        at=snapshot["at"],
        overloaded=frozenset(lane for lane, state in policy.items() if state["overloaded"]),
        exhausted=frozenset(snapshot.get("exhausted", ())),
        levels=snapshot.get("levels", {}),
        retry_after_s=max(1.0, lanes.get("relaxed", {}).get("expected_wait_s", 1.0)),
        ring=ring(routable), epsilon=epsilon,
        loads={host: sum(w.get("in_flight", {}).values()) + w.get("queued", 0)
               for host, w in routable.items()},
        warm={host: tuple(dict.fromkeys([*w.get("warm_models", ()),
                                         *w.get("loading_models", ())]))
              for host, w in routable.items()},
        slots={host: w.get("slots", 1) for host, w in routable.items()},
        # a worker not measured yet drains like the median one
        drain_s={host: drain.get(host, known[len(known) // 2]) for host in routable} if known
        else {},
        cold_s=cold, cold_default_s=sum(cold.values()) / len(cold) if cold else 0.0,
    )


def touched(warm: tuple[str, ...], model: str, slots: int) -> tuple[str, ...]:
    """A worker's warm models, least recently used first, after it runs ``model``."""
    kept = tuple(m for m in warm if m != model) + (model,)
    return kept[-max(1, slots):]


def full_lanes(snapshot: dict, sent: Mapping[str, int],
               max_depth: Mapping[str, int]) -> frozenset[str]:
    """Lanes at their maximum depth, counting jobs this process sent since the snapshot."""
    lanes = snapshot.get("lanes", {})
    return frozenset(lane for lane in LANES
                     if lanes.get(lane, {}).get("depth", 0) + sent.get(lane, 0)
                     >= max_depth[lane])


def view_from_snapshot(snapshot: dict, sent: Mapping[str, int],
                       max_depth: Mapping[str, int]) -> PolicyView:
    """The full routing view of a snapshot."""
    return replace(base_view(snapshot), full=full_lanes(snapshot, sent, max_depth))


class SnapshotCache:
    """Holds the latest snapshot; ``view()`` is a pure in-memory read."""

    def __init__(self, fetch: Callable[[], str | None], refresh_s: float, stale_s: float,
                 max_depth: Mapping[str, int], clock: Callable[[], float] = time.time,
                 epsilon: float = 0.25) -> None:
        self.fetch, self.refresh_s, self.stale_s = fetch, refresh_s, stale_s
        self.max_depth, self.clock, self.epsilon = dict(max_depth), clock, epsilon
        # (snapshot, its base view), swapped whole by refresh(): view() reads it
        # without a lock, as one attribute.
        self._state: tuple[dict, PolicyView] | None = None
        # Jobs this process sent that the snapshot may not count yet:
        # (time, lane, worker or None, model), their totals per lane, and what
        # they did to each worker: jobs added, models made warm. The last two
        # are replaced whole (never changed in place): view() reads them unlocked.
        self._log: deque[tuple[float, str, str | None, str]] = deque()
        self._sent: dict[str, int] = {}
        self._node_sent: dict[str, int] = {}
        self._warm: dict[str, tuple[str, ...]] = {}
        # The models of the last DEMAND_WINDOW jobs routed, and counts of each:
        # each snapshot assigns homes from them, most wanted first.
        self._recent: deque[str] = deque()
        self._demand: dict[str, int] = {}
        # Lanes a publish found at their maximum depth (``note_full``) -> when: full
        # until a snapshot measured later arrives, or for one heartbeat at most.
        self._refused: dict[str, float] = {}
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None
        self._warned = False
        os.register_at_fork(after_in_child=self._forget_thread)

    def forget(self) -> None:
        """Drop the copy, every send counted against it and the demand seen, then
        read afresh (after the snapshot in Redis was deleted: a new cluster, a
        flushed test Redis)."""
        with self._lock:
            self._state, self._sent, self._node_sent, self._warm = None, {}, {}, {}
            self._demand, self._refused = {}, {}
            self._log.clear()
            self._recent.clear()
        self.refresh()

    def _forget_thread(self) -> None:
        self._thread, self._lock = None, threading.Lock()

    def refresh(self) -> None:
        """Read the snapshot once; keep the old copy if Redis cannot answer."""
        try:
            raw = self.fetch()
        except Exception as exc:  # noqa: BLE001  the router must keep working
            log.debug("snapshot refresh failed: %s", exc)
            return
        if raw:
            snapshot = json.loads(raw)
            with self._lock:
                if self._state is None or snapshot["at"] != self._state[0]["at"]:
                    previous = self._state and self._state[1].homes
                    self._state = (snapshot, base_view(snapshot, self.epsilon))
                    self._rehome(previous)
                    measured_at = snapshot.get("measured_at", snapshot["at"])
                    self._forget_sent_before(measured_at)
                    self._refused = {lane: at for lane, at in self._refused.items()
                                     if at >= measured_at}
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
        """Give the wanted models homes on the current workers (caller holds the lock)."""
        snapshot, base = self._state
        wanted = sorted((m for m, n in self._demand.items() if n),
                        key=lambda m: (-self._demand[m], m))
        homes = assign_homes(wanted, base.ring, base.slots, previous)
        self._state = (snapshot, replace(base, homes=homes))

    def _replay(self) -> None:
        """The new snapshot's workers, with the sends it did not see applied again."""
        base = self._state[1]
        self._node_sent, self._warm = {}, dict(base.warm)
        for _, _, node, model in self._log:
            self._apply(node, model)

    def _apply(self, node: str | None, model: str) -> None:
        if node is not None and node in self._warm:
            self._node_sent = {**self._node_sent, node: self._node_sent.get(node, 0) + 1}
            slots = self._state[1].slots.get(node, 1)
            self._warm = {**self._warm, node: touched(self._warm[node], model, slots)}

    def note_sent(self, lane: str, node: str | None = None, model: str = "") -> None:
        """Count a job sent to ``lane`` (``node``'s own queue of it, for ``model``)
        until a snapshot measured after it: the lane's depth, the worker's load,
        and the model it will make warm there."""
        with self._lock:
            now = self.clock()
            # a send older than stale_s predates any snapshot this router may still
            # route from: drop it now, or with beat down the log grows without end
            self._forget_sent_before(now - self.stale_s)
            self._log.append((now, lane, node, model))
            self._sent[lane] = self._sent.get(lane, 0) + 1
            if self._state is not None:
                self._apply(node, model)
            self._recent.append(model)
            self._demand[model] = self._demand.get(model, 0) + 1
            if len(self._recent) > DEMAND_WINDOW:
                self._demand[self._recent.popleft()] -= 1
            if self._demand[model] == 1 and self._state is not None:
                # newly wanted: home it now (a model left without a home, all slots
                # taken, is not re-tried on every send; the next snapshot re-homes)
                self._rehome(self._state[1].homes)

    def note_full(self, lane: str) -> None:
        """A publish found ``lane`` at its maximum depth: route as if it is full
        until a snapshot measured after now (or one heartbeat: ``2 * refresh_s``)."""
        with self._lock:
            self._refused = {**self._refused, lane: self.clock()}

    def refused(self) -> frozenset[str]:
        """Lanes held full since a publish found them so (see ``note_full``)."""
        since = self.clock() - 2 * self.refresh_s
        return frozenset(lane for lane, at in self._refused.items() if at >= since)

    def view(self) -> PolicyView | None:
        """The current view, or None when there is no fresh snapshot."""
        self.start()
        state = self._state
        age_s = None if state is None else self.clock() - state[0]["at"]
        if age_s is None or age_s > self.stale_s:
            if not self._warned:
                log.warning("no fresh lane snapshot (age %s s): routing by tier only",
                            "n/a" if age_s is None else f"{age_s:.0f}")
                self._warned = True
            return None
        self._warned = False
        snapshot, base = state
        full = full_lanes(snapshot, self._sent, self.max_depth)
        if self._node_sent or base.drain_s:
            base = replace(base, warm=self._warm, loads=self._loads_now(snapshot, base))
        return replace(base, full=full) if full else base

    def _loads_now(self, snapshot: dict, base: PolicyView) -> dict[str, float]:
        """Each worker's load as measured, plus this process's sends since, less
        the jobs it has had time to finish since (a fluid estimate)."""
        elapsed_s = max(0.0, self.clock() - snapshot.get("measured_at", snapshot["at"]))
        sent = self._node_sent
        return {node: max(0.0, load + sent.get(node, 0)
                          - (elapsed_s / base.drain_s[node] if base.drain_s.get(node) else 0))
                for node, load in base.loads.items()}
