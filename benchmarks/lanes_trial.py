"""One trial of ``benchmarks/lanes.py``, whichever side it drives, and the plain side's
entry point.

A trial takes the side's publish as a function, so both sides run the same steps.
:func:`plain_trial` runs in the plain publisher's process
(``benchmarks.plain_run.PlainClient``): this module imports no gpulanes code, and it
publishes through ``benchmarks.plain_app`` only.
"""
from __future__ import annotations

import statistics
import time
import uuid
from pathlib import Path
from typing import Any, Callable

from benchmarks.common import PROMPT, JobSize

#: (tier, seed, gate) -> the job's AsyncResult; a job with a gate holds until it exists.
Send = Callable[[str, int, "Path | None"], Any]
#: The plain modes: every job in one queue, or each in its tier's queue.
PLAIN_QUEUES = {"fifo": lambda tier: "standard", "plain_lanes": lambda tier: tier}


def wait_started(result: Any, timeout_s: float = 60.0) -> None:
    """Block until the worker has picked ``result``'s job up."""
    deadline = time.monotonic() + timeout_s
    while result.state not in ("STARTED", "SUCCESS"):
        if result.state in ("FAILURE", "REVOKED") or time.monotonic() > deadline:
            raise RuntimeError(f"blocker job {result.id} did not start: {result.state}")
        time.sleep(0.002)


def trial(send: Send, mode: str, backlog: int, gate_dir: Path) -> dict[str, Any]:
    """One run of the experiment; the fast job's wait and position in start order."""
    from celery.result import ResultSet

    gate = gate_dir / uuid.uuid4().hex
    try:
        blocker = send("relaxed", 0, gate)  # occupies the worker until the gate opens
        wait_started(blocker)
        jobs = [send("relaxed", i + 1, None) for i in range(backlog)]
        fast = send("fast", backlog + 1, None)
    finally:
        gate.touch()  # also on error or Ctrl-C, so the worker can stop
    done = ResultSet([blocker, *jobs, fast]).get(timeout=300 + backlog)
    return summarize(mode, backlog, done)


def summarize(mode: str, backlog: int, done: list[dict]) -> dict[str, Any]:
    """Reduce one trial's result dicts (blocker first, fast job last) to its figures."""
    fast, after_blocker = done[-1], sorted(done[1:], key=lambda r: r["started_at"])
    starts = [r["started_at"] for r in after_blocker]
    service_ms = ((starts[-1] - starts[0]) * 1000 / (len(starts) - 1)
                  if len(starts) > 1 else None)
    return {
        "mode": mode, "backlog": backlog, "fast_wait_ms": fast["queued_ms"],
        "fast_position": [r["job_id"] for r in after_blocker].index(fast["job_id"]),
        "fast_lane": fast["lane"], "service_ms": service_ms,
        "run_ms": statistics.fmean(r["run_ms"] for r in done[1:]),
    }


def plain_trial(mode: str, backlog: int, size: JobSize, gate_dir: Path) -> dict[str, Any]:
    """One plain trial: ``apply_async`` to one queue (``fifo``) or the tier's
    (``plain_lanes``), through the plain app only."""
    from benchmarks import plain_app

    queue = PLAIN_QUEUES[mode]

    def send(tier: str, seed: int, gate: Path | None) -> Any:
        return plain_app.send(queue(tier), PROMPT, seed, size, gate=gate and str(gate))

    return trial(send, mode, backlog, gate_dir)
