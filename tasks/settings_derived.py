"""The values gpulanes derives from its settings rather than reading: timeouts, leases
and lifetimes that follow the configured ones (``settings.lease_ttl_s``...), and the
form a setting takes where it is used (``settings.cells``, ``settings.artifact_root``).
"""
from __future__ import annotations

import math
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tasks.settings_defaults import BUILT_IN_MODELS, RETRY_CAP_S, SICK_AFTER


class Derived:
    """The derived values of :class:`tasks.settings.Settings`, as properties of it."""

    if TYPE_CHECKING:  # the fields they derive from (tasks.settings.Settings)
        state_dir: Path
        artifact_dir: Path
        artifact_url: str | None
        broker_url: str | None
        _cells: dict[str, str]
        models: dict[str, str]
        warm_models: tuple[str, ...]
        max_job_s: float
        max_retries: int
        max_wait_s: dict[str, float]
        cache: bool
        cache_ttl_s: int
        heartbeat_s: float
        redis_timeout_s: float
        result_ttl_s: int

    @property
    def embedded_socket(self) -> Path:
        """The embedded Redis' Unix socket (used when no broker URL is set)."""
        return self.state_dir / "redis.sock"

    @property
    def cells(self) -> dict[str, str]:
        """The cells the broker URL names ({pool: Redis URL}, in order); {}: one Redis
        (``broker_url``, which with cells is this process's own pool's, else the first)."""
        return self._cells

    @property
    def embedded_broker(self) -> bool:
        """No broker URL was given: the embedded Redis on ``embedded_socket``."""
        return self.broker_url == f"redis+socket://{self.embedded_socket}"

    @property
    def artifact_root(self) -> str:
        """Where artifacts are stored: ARTIFACT_URL, else ARTIFACT_DIR as a plain path."""
        return self.artifact_url or str(self.artifact_dir)

    @property
    def warm(self) -> tuple[str, ...]:
        """The models a worker may warm at start, in order: WARM_MODELS, else ``demo``
        with the built-in list, else all of MODELS (the worker keeps those that fit:
        ``gpu_worker.memory.default_warm``)."""
        if self.warm_models:
            return self.warm_models
        return ("demo",) if self.models == BUILT_IN_MODELS else tuple(self.models)

    @property
    def beat_lease_s(self) -> float:
        """A leading beat's lease lapses this long after its last renewal (renewed 4
        times as often, from its own thread), and a standby leads: 2 heartbeats."""
        return 2 * self.heartbeat_s

    @property
    def snapshot_stale_s(self) -> float:
        """Routers fall back to plain tier routing past this age of beat's snapshot: 3
        heartbeats, a leader's lease (a standby takes over within it) and 2 s."""
        return 3 * self.heartbeat_s + self.beat_lease_s + 2

    @property
    def fair_aging_s(self) -> float:
        """A relaxed job waiting this long goes first whatever its level: standard's budget."""
        return self.max_wait_s["standard"]

    @property
    def preempt_min_left_s(self) -> float:
        """A run steps aside only while it expects this long still to run: fast budget / 10."""
        return self.max_wait_s["fast"] / 10

    @property
    def redis_connect_timeout_s(self) -> float:
        """Longest a connection to Redis may take to open: REDIS_TIMEOUT_S."""
        return self.redis_timeout_s

    @property
    def redis_replica_wait_s(self) -> float:
        """How long a write waits for its replicas (then ``NOREPLICAS``): REDIS_TIMEOUT_S / 3."""
        return self.redis_timeout_s / 3

    @property
    def revoke_ttl_s(self) -> int:
        """How long a revoke is remembered: as long as a result (RESULT_TTL_S)."""
        return self.result_ttl_s

    @property
    def artifact_ttl_s(self) -> int:
        """Artifacts older than this are swept from the store by workers: as long as a
        result may name them (RESULT_TTL_S, plus CACHE_TTL_S: a cache hit's result does)."""
        return self.result_ttl_s + (self.cache_ttl_s if self.cache else 0)

    @property
    def run_hung_s(self) -> float:
        """A run holding its job this long is hung (a step that never returned: steps
        stop at MAX_JOB_S): its message goes back, its lease is lost. 2 x MAX_JOB_S."""
        return 2 * self.max_job_s

    @property
    def keepalive_s(self) -> float:
        """How often a worker marks the jobs it holds as still held."""
        return min(self.heartbeat_s, _copies_s(self) / 4)

    @property
    def lease_ttl_s(self) -> int:
        """A running job's lease lapses this long after its worker last extended it."""
        return max(1, min(math.ceil(3 * self.keepalive_s), _copies_s(self) - 1))

    @property
    def runs_kept_s(self) -> int:
        """How long a job's run records are kept: past every copy of it, its
        redeliveries, each retry's run and backoff, and sick workers' runs."""
        attempts = 2 * self.max_retries + SICK_AFTER + 1
        return math.ceil(2 * _copies_s(self) + attempts * (self.max_job_s + RETRY_CAP_S))

    def for_model(self, table: dict[str, Any], model: str) -> Any:
        """``model``'s entry of a per-model table (``max_batch``...), else its ``*``."""
        return table.get(model, table["*"])


def _copies_s(s: Derived) -> int:
    """How long after a job's run began another copy of it may still come: a run of
    MAX_JOB_S and the longest retry backoff, twice over."""
    return int(2 * s.max_job_s + RETRY_CAP_S)
