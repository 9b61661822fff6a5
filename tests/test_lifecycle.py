"""Worker lifecycle on real processes: clean shutdown, crash restart, redelivery."""
from __future__ import annotations

import os
import signal
import time

import pytest

from gpu_worker.launcher import worker_command
from routing.names import STATS_COMMAND
from tasks import submit

pytestmark = pytest.mark.cluster
SMALL = dict(steps=4, width=64, height=64)


def _wait_state(result, states, timeout_s: float = 30.0) -> None:
    deadline = time.monotonic() + timeout_s
    while result.state not in states:
        assert time.monotonic() < deadline, f"still {result.state}, wanted {states}"
        time.sleep(0.02)


def _worker_pids(app, expected: int, timeout_s: float = 60.0) -> dict[str, int]:
    deadline = time.monotonic() + timeout_s
    while True:
        answers = app.control.broadcast(STATS_COMMAND, reply=True, timeout=0.5) or []
        pids = {host: reply["pid"] for answer in answers for host, reply in answer.items()}
        if len(pids) == expected:
            return pids
        assert time.monotonic() < deadline, f"workers answering: {pids}"


def _gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    return False


def test_workers_consume_lanes_in_priority_order():
    command = worker_command(0, 1, "INFO")
    assert command[command.index("--queues") + 1] == "fast,standard,relaxed"
    assert command[command.index("--pool") + 1] == "threads"
    assert command[command.index("--hostname") + 1] == "gpu0@%h"


def test_sigterm_finishes_the_running_job_and_stops_cleanly(cluster_factory, app):
    cluster = cluster_factory(workers=2)
    pids = _worker_pids(app, 2)
    running = submit("sleep:1.5 finish me", model="flaky", **SMALL)
    _wait_state(running, ("STARTED",))
    assert cluster.stop_workers(timeout_s=60) == 0
    assert running.get(timeout=5)["attempts"] == 1  # finished, not abandoned
    assert all(_gone(pid) for pid in pids.values())


def test_crashed_worker_is_restarted_and_its_job_runs_again(cluster_factory, app):
    # MAX_JOB_S=2 makes the visibility timeout 2*2+1 = 5 s for this cluster.
    cluster_factory(workers=1, env={"GPULANES_MAX_JOB_S": "2"})
    (host, pid), = _worker_pids(app, 1).items()
    doomed = submit("sleep:0.5 killed mid-job", model="flaky", **SMALL)
    _wait_state(doomed, ("STARTED",))
    os.kill(pid, signal.SIGKILL)
    (new_host, new_pid), = _worker_pids(app, 1, timeout_s=60).items()
    assert new_host == host and new_pid != pid
    out = doomed.get(timeout=60)  # back from Redis after the visibility timeout
    assert out["attempts"] == 2 and out["worker"] == host
