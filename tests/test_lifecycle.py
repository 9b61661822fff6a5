"""Worker lifecycle on real processes: clean shutdown, crash restart, redelivery."""
from __future__ import annotations

import json
import os
import re
import signal
import socket
import time

import pytest
from conftest import SMALL, new_gate, wait_at_gate, wait_until

from gpu_worker.launcher import MALLOC_ENV, worker_command, worker_env
from routing.names import STATS_COMMAND
from routing.placement import serving
from tasks import submit
from tasks.broker.keys import METRICS_KEY, WORKER_STATS_KEY, metric_field
from tasks.broker.store import broker_client
from tests.flaky_model import open_gate

pytestmark = pytest.mark.cluster

def _worker_pids(app, expected: int, timeout_s: float = 60.0) -> dict[str, int]:
    deadline = time.monotonic() + timeout_s
    while True:
        answers = app.control.broadcast(STATS_COMMAND, reply=True, timeout=0.5) or []
        pids = {host: reply["pid"] for answer in answers for host, reply in answer.items()}
        if len(pids) == expected:
            return pids
        assert time.monotonic() < deadline, f"workers answering: {pids}"


def _wait_for_log(path, text: str, count: int = 1, timeout_s: float = 60.0) -> None:
    wait_until(lambda: (path.read_text() if path.exists() else "").count(text) >= count,
               timeout_s, what=f"{text!r} x{count} in {path}")


def _gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    return False


def test_workers_consume_lanes_in_priority_order():
    command = worker_command(0, 1, "INFO")
    node = f"gpu0@{socket.gethostname()}"
    assert command[command.index("--hostname") + 1] == node
    assert command[command.index("--queues") + 1].split(",") == [
        f"fast.{node}", "fast", f"standard.{node}", "standard", f"relaxed.{node}", "relaxed"]
    assert command[command.index("--pool") + 1] == "threads"


def test_cuda_pinning_narrows_the_operators_mask(monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "2,GPU-5f1c")
    assert worker_env(0, "cuda")["CUDA_VISIBLE_DEVICES"] == "2"
    assert worker_env(1, "cuda")["CUDA_VISIBLE_DEVICES"] == "GPU-5f1c"
    assert worker_env(1, "cuda")["GPULANES_WORKER_DEVICE"] == "cuda:0"
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES")
    assert worker_env(1, "cuda")["CUDA_VISIBLE_DEVICES"] == "1"
    assert worker_env(1, "cpu")["GPULANES_WORKER_DEVICE"] == "cpu"


def test_a_worker_malloc_keeps_freed_memory_unless_the_operator_says_otherwise(monkeypatch):
    monkeypatch.delenv("MALLOC_TRIM_THRESHOLD_", raising=False)
    monkeypatch.setenv("MALLOC_MMAP_THRESHOLD_", "131072")
    env = worker_env(0, "cpu")
    assert env["MALLOC_TRIM_THRESHOLD_"] == MALLOC_ENV["MALLOC_TRIM_THRESHOLD_"]
    assert env["MALLOC_MMAP_THRESHOLD_"] == "131072"  # the operator's


def test_worker_that_cannot_warm_its_model_exits_instead_of_consuming(cluster_factory, app):
    from conftest import STATE_DIR

    from tasks.dev.cluster import LocalCluster

    broken = LocalCluster(STATE_DIR, workers=1, device="cpu", beat=False,
                          env={"GPULANES_WARM_MODELS": "demo,missing",
                               "GPULANES_MODELS": "demo=gpu_worker.demo_model:load,"
                                                  "missing=tests.odd_models:unloadable"},
                          log_dir=STATE_DIR / "logs" / "broken")
    broken.start_workers()
    try:
        log = STATE_DIR / "logs" / "broken" / "workers.log"
        _wait_for_log(log, "exited with 78")
        assert not app.control.ping(timeout=0.5)  # it never joined
        assert "cannot warm the models" in log.read_text()
    finally:
        broken.stop_workers(timeout_s=30)


def test_sigterm_hands_the_running_job_back_and_stops_cleanly(cluster_factory, app):
    """A scale-down: the running job steps aside at its next step, back to the front of
    its lane, and the workers exit at once rather than run it to its end; a worker
    started later runs it (again from its start: the flaky model does not resume). A
    job finished since the last heartbeat is counted as the workers stop."""
    cluster = cluster_factory(workers=2, env={"GPULANES_HEARTBEAT_S": "600"})
    pids = _worker_pids(app, 2)

    def run_s() -> float:  # the standard lane's run seconds, as the exporter counts them
        return float(broker_client().hget(METRICS_KEY, metric_field("run_sum", "standard"))
                     or 0)
    counted_before = run_s()
    done = submit("finished before the stop", model="flaky", **SMALL).get(timeout=60)
    assert done["lane"] == "standard"
    gate = new_gate()
    running = submit(f"gate:{gate} hand me back", model="flaky", **SMALL)
    wait_at_gate(running, gate)
    cluster.supervisor.send_signal(signal.SIGTERM)
    _wait_for_log(cluster.log_dir / "workers.log", "Warm shutdown", count=2)
    assert running.state == "STARTED"  # still held while the workers shut down
    open_gate(gate)  # its next step comes: it steps aside there
    assert cluster.stop_workers(timeout_s=60) == 0
    assert all(_gone(pid) for pid in pids.values())
    log = (cluster.log_dir / "workers.log").read_text(errors="replace")
    assert re.search(rf"job {running.id} stepped aside at step \d+: this worker is stopping",
                     log)
    assert running.state != "SUCCESS"  # not run to its end on the way out
    assert run_s() > counted_before  # pushed on the way out, not left to a next heartbeat
    for host in pids:  # and that push says no job may go to them any more
        last = json.loads(broker_client().hget(WORKER_STATS_KEY, host))
        assert last["leaving"] and not serving({**last, "alive": True}), last
    cluster.start_workers()
    out = running.get(timeout=60)
    assert out["attempts"] == 2 and out["preempted"] == 1
    assert cluster.stop_workers(timeout_s=60) == 0  # the next test starts its own


def test_crashed_worker_is_restarted_and_its_job_runs_again(cluster_factory, app):
    # no beat: the restarted worker gives back what its dead predecessor held
    cluster_factory(workers=1, env={"GPULANES_MAX_JOB_S": "2"})
    (host, pid), = _worker_pids(app, 1).items()
    gate = new_gate()
    doomed = submit(f"gate:{gate} killed mid-job", model="flaky", **SMALL)
    wait_at_gate(doomed, gate)
    os.kill(pid, signal.SIGKILL)
    open_gate(gate)
    (new_host, new_pid), = _worker_pids(app, 1, timeout_s=60).items()
    assert new_host == host and new_pid != pid
    out = doomed.get(timeout=60)
    assert out["attempts"] == 2 and out["worker"] == host
