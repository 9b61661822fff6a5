"""What one finished job adds to the cluster's counters: the metrics
(``METRICS_KEY``), which the Prometheus exporter (``tasks.ops.metrics``) reads, and
its account's GPU seconds (``usage_key``), which beat reads for fair shares. A worker
adds its jobs' counts with its stats push, every heartbeat."""
from __future__ import annotations

import bisect
import threading
import time
from typing import Any

from tasks.broker.keys import METRICS_KEY, USAGE_BUCKET_S, metric_field, usage_key

#: Upper bounds (seconds) of the histogram buckets of queue wait and run time.
QUEUE_WAIT_BUCKETS_S: tuple[float, ...] = (0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120,
                                           300, 600, 1800)
RUN_BUCKETS_S: tuple[float, ...] = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60,
                                    120, 300)


#: A counter: (its hash, its field).
Counter = tuple[str, str]


def job_counts(result: dict[str, Any], account: str, now: float | None = None
               ) -> dict[Counter, float]:
    """What one finished job adds: its histogram buckets and sums of queue wait and
    run time in its lane, its downgrade reason if any, and its run time to
    ``account``'s usage in the bucket of ``now`` (default: now)."""
    lane = result["lane"]
    wait_s, run_s = result["queued_ms"] / 1000, result["run_ms"] / 1000
    counts = {
        metric_field("queue_wait_bucket", lane,
                     str(bisect.bisect_left(QUEUE_WAIT_BUCKETS_S, wait_s))): 1,
        metric_field("queue_wait_sum", lane): wait_s,
        metric_field("run_bucket", lane, str(bisect.bisect_left(RUN_BUCKETS_S, run_s))): 1,
        metric_field("run_sum", lane): run_s,
    }
    if result.get("downgrade_reason"):
        counts[metric_field("downgrades", result["downgrade_reason"])] = 1
    bucket = usage_key(int(time.time() if now is None else now) // USAGE_BUCKET_S)
    return {**{(METRICS_KEY, field): amount for field, amount in counts.items()},
            (bucket, account): run_s}


class PendingCounts:
    """What this process's finished jobs add to the counters, until a stats push adds
    it (``tasks.broker.stats.push_stats``): the per-job path writes no counter.

    A batch taken for a push keeps its number until a push of it is answered: a push
    retried after a lost reply carries the same number and Redis adds it once. A
    process that dies loses what it had not pushed (at most one heartbeat's jobs).
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._new: dict[Counter, float] = {}
        self._batch: tuple[int, dict[Counter, float]] | None = None
        self._number = 0

    def add(self, counts: dict[Counter, float]) -> None:
        with self._lock:
            for field, amount in counts.items():
                self._new[field] = self._new.get(field, 0) + amount

    def batch(self) -> tuple[int, dict[Counter, float]] | None:
        """(number, counts) to push: the unanswered batch, else what came since."""
        with self._lock:
            if self._batch is None and self._new:
                self._number += 1
                self._batch, self._new = (self._number, self._new), {}
            return self._batch

    def pushed(self, number: int) -> None:
        """Batch ``number`` is in Redis."""
        with self._lock:
            if self._batch is not None and self._batch[0] == number:
                self._batch = None


#: This worker process's counts not yet pushed.
COUNTS = PendingCounts()
