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
from routing.placement import ring
from routing.policy import PolicyView

log = logging.getLogger(__name__)


def base_view(snapshot: dict, epsilon: float = 0.25) -> PolicyView:
    """The routing view of a snapshot, lane fullness aside (built once per snapshot)."""
    lanes, policy = snapshot.get("lanes", {}), snapshot.get("policy", {})
    alive = {host: w for host, w in snapshot.get("workers", {}).items() if w.get("alive")}
    return PolicyView(
        at=snapshot["at"],
        overloaded=frozenset(lane for lane, state in policy.items() if state["overloaded"]),
        exhausted=frozenset(snapshot.get("exhausted", ())),
        levels=snapshot.get("levels", {}),
        retry_after_s=max(1.0, lanes.get("relaxed", {}).get("expected_wait_s", 1.0)),
        ring=ring(alive), epsilon=epsilon,
        loads={host: sum(w.get("in_flight", {}).values()) + w.get("queued", 0)
               for host, w in alive.items()},
        warm={host: frozenset(w.get("warm_models", ())) | frozenset(w.get("loading_models", ()))
              for host, w in alive.items()},
    )


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
        # (time, lane), and their totals per lane.
        self._log: deque[tuple[float, str]] = deque()
        self._sent: dict[str, int] = {}
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None
        self._warned = False
        os.register_at_fork(after_in_child=self._forget_thread)

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
                    self._state = (snapshot, base_view(snapshot, self.epsilon))
                    self._forget_sent_before(snapshot.get("measured_at", snapshot["at"]))

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
            _, lane = self._log.popleft()
            self._sent[lane] -= 1

    def note_sent(self, lane: str) -> None:
        """Count a job sent to ``lane`` until a snapshot measured after it."""
        with self._lock:
            self._log.append((self.clock(), lane))
            self._sent[lane] = self._sent.get(lane, 0) + 1

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
        return replace(base, full=full) if full else base
