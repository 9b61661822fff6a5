"""What one finished job adds to the cluster's counters (``METRICS_KEY``), which
the Prometheus exporter (``tasks.ops.metrics``) reads."""
from __future__ import annotations

import bisect
from typing import Any

from tasks.broker.keys import metric_field

#: Upper bounds (seconds) of the histogram buckets of queue wait and run time.
QUEUE_WAIT_BUCKETS_S: tuple[float, ...] = (0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120,
                                           300, 600, 1800)
RUN_BUCKETS_S: tuple[float, ...] = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60,
                                    120, 300)


def job_counts(result: dict[str, Any]) -> dict[str, float]:
    """What one finished job adds to ``METRICS_KEY``: its histogram buckets and sums
    of queue wait and run time in its lane, and its downgrade reason if any."""
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
    return counts
