"""Sick workers step aside: a worker whose jobs keep failing for its own reasons
(disk, device, model files) stops consuming, leaves routing, and comes back once
its self-check passes; its jobs complete elsewhere."""
from __future__ import annotations

import errno
import json
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import pytest
from conftest import SMALL, wait_until

from beat.snapshot import lane_loads
from gpu_worker.faults import folder_of, self_check
from gpu_worker.health import HealthHook, Lever, SelfHealth, is_worker_fault
from routing.names import CONSUME_COMMAND, worker_queue, worker_queues
from routing.placement import holders, home, prewarm_targets, ring, serving
from routing.snapshot import base_view
from tasks.broker.keys import WORKERS_KEY, lane_keys
from tasks.errors import ArtifactError, JobTimeout, ModelError, TransientJobError
from tasks.settings import SICK_AFTER, settings

PROJECT_DIR = Path(__file__).resolve().parent.parent
REASON = "3 jobs in a row failed here: PermissionError: [Errno 13] Permission denied: '/a/b'"


# --- which failures are the worker's --------------------------------------------

def _cuda_oom() -> BaseException:
    import torch
    return torch.cuda.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")


@pytest.mark.parametrize("exc", [
    PermissionError(errno.EACCES, "Permission denied", "/data/artifacts/x.png"),
    NotADirectoryError(errno.ENOTDIR, "Not a directory", "/data/scratch/x"),
    OSError(errno.ENOSPC, "No space left on device"),
    OSError(errno.EIO, "Input/output error"),
    RuntimeError("CUDA error: an illegal memory access was encountered"),
    ArtifactError("cannot write the PNG"),
], ids=type)
def test_disk_and_device_errors_are_the_workers_fault(exc):
    assert is_worker_fault(exc)


def test_torch_device_errors_are_the_workers_fault():
    import torch
    assert is_worker_fault(torch.AcceleratorError("CUDA error: unspecified launch failure"))


@pytest.mark.parametrize("exc", [
    ValueError("simulated bug in the model"), ConnectionError("redis went away"),
    ConnectionResetError(errno.ECONNRESET, "reset"), TimeoutError("slow redis"),
    JobTimeout("ran past GPULANES_MAX_JOB_S"), TransientJobError("simulated"),
    ModelError("model 'x': cannot import factory"),  # broken everywhere, not here only
    RuntimeError("shape mismatch"), "oom",
], ids=lambda e: type(e).__name__ if e != "oom" else "torch-oom")
def test_bugs_timeouts_lost_connections_and_oom_are_not(exc):
    assert not is_worker_fault(_cuda_oom() if exc == "oom" else exc)


# --- counting, stepping aside, coming back ------------------------------------------

class FakeControl:
    """Records the queues each control command a lever sends asks for (to whom)."""

    def __init__(self) -> None:
        self.sent: list[tuple[list[str], list[str]]] = []

    def broadcast(self, command: str, arguments: dict, destination: list[str]) -> None:
        assert command == CONSUME_COMMAND
        self.sent.append((arguments["queues"], destination))


def _lever(host: str = "gpu0@h", queues: list[str] | None = None) -> Lever:
    return Lever(SimpleNamespace(control=FakeControl()), host, queues or worker_queues(host))


def test_sick_after_n_worker_faults_in_a_row_and_a_success_resets_the_count():
    health = SelfHealth(sick_after=3)
    fault = PermissionError(errno.EACCES, "Permission denied", "/a/b")
    health.failed(fault)
    health.failed(fault)
    health.failed(ValueError("a bug of the job: neither counts nor breaks the row"))
    assert health.stats() == {"sick": None, "worker_faults": 2}
    health.succeeded()
    health.failed(fault)
    health.failed(fault)
    assert health.stats() == {"sick": None, "worker_faults": 2}
    health.failed(fault)
    assert health.stats() == {"sick": REASON, "worker_faults": 3}


def test_the_lever_stops_every_queue_once_and_restores_their_priority_order():
    host = "gpu0@h"
    # consumed in any order: the lever keeps worker_queues' order (own fast, fast, ...)
    lever = _lever(host, list(reversed(worker_queues(host))))
    health = SelfHealth(sick_after=2, probe_s=3600)  # the test drives probe() itself
    health.lever = lever
    for _ in range(4):
        health.failed(OSError(errno.EIO, "Input/output error"))
    sent = lever.app.control.sent
    assert sent == [([], [host])]  # once, whatever faults follow
    assert health.probe() and health.stats() == {"sick": None, "worker_faults": 0}
    assert sent[1:] == [(worker_queues(host), [host])]
    assert worker_queues(host)[:2] == [worker_queue("fast", host), "fast"]


def test_a_broken_folder_keeps_it_aside_until_mended_then_it_serves_again(tmp_path):
    folder = tmp_path / "scratch"
    folder.write_text("a file where the folder should be")
    health, lever = SelfHealth(sick_after=3, probe_s=0.05), _lever()
    health.lever = lever
    for _ in range(3):
        with pytest.raises(OSError) as caught:
            folder.mkdir(parents=True, exist_ok=True)  # as a job keeping a local cache would
        health.failed(caught.value)
    assert str(folder) in health.sick and "FileExistsError" in health.sick
    assert not health.probe()  # the folder is still a file: still aside
    assert health.sick and lever.app.control.sent == [([], [lever.hostname])]
    folder.unlink()
    wait_until(lambda: health.sick is None, timeout_s=10, what="the periodic self-check")
    assert folder.is_dir()  # the check made the folder, as the job would
    assert lever.app.control.sent[1:] == [(lever.queues, [lever.hostname])]


def test_each_kind_of_fault_gets_its_own_check(monkeypatch, tmp_path):
    from gpu_worker import faults
    from gpu_worker.runtime import RUNTIME

    denied = PermissionError(errno.EACCES, "Permission denied", str(tmp_path / "x.png"))
    assert folder_of(denied) == tmp_path
    assert folder_of(FileExistsError(errno.EEXIST, "File exists", str(tmp_path))) == tmp_path
    assert folder_of(OSError(errno.ENOSPC, "No space left on device")) is None
    checked: list = []
    monkeypatch.setattr(faults, "check_folders", checked.append)
    monkeypatch.setattr(faults, "check_store", lambda root, n: checked.append((root, n)))
    written = faults.ArtifactBytes()
    written.ran(1234)
    self_check(denied, written)()
    wrapped = ArtifactError("cannot write the PNG")
    wrapped.__cause__ = denied
    self_check(wrapped, written)()
    # the folder that failed, and room in the store for what recent jobs wrote
    assert checked == [[tmp_path], (settings.artifact_root, 1234)] * 2
    checked.clear()
    full = ArtifactError("cannot write the PNG")  # refused in the artifact folder itself
    full.__cause__ = OSError(errno.ENOSPC, "No space left on device",
                             str(Path(settings.artifact_dir) / "x.png"))
    written.ran(99)
    self_check(full, written)()
    assert checked == [[], (settings.artifact_root, 1234)]  # one check of the store
    monkeypatch.setattr(RUNTIME, "device", "cpu")
    check = self_check(RuntimeError("CUDA error: device-side assert triggered"))
    assert check is faults.check_device
    check()  # a tiny op on the (CPU) device passes


def test_the_hook_gives_the_lever_in_priority_order():
    from gpu_worker import health as health_module

    health, host = SelfHealth(sick_after=1, probe_s=3600), "gpu1@h"
    sweeps: list = []
    hook = HealthHook(health, SimpleNamespace(start=lambda: sweeps.append(1)))
    queues = [SimpleNamespace(name=q) for q in reversed(worker_queues(host))]
    consumer = SimpleNamespace(app=SimpleNamespace(control=FakeControl()), hostname=host,
                               task_consumer=SimpleNamespace(queues=queues))
    hook.on_ready(sender=consumer)
    assert health.lever.queues == worker_queues(host) and health.lever.hostname == host
    assert sweeps == [1]  # and the artifact sweep started, once
    assert set(hook.handlers().values()) == {hook.on_ready}
    assert health_module.HEALTH_HOOK.health is health_module.HEALTH


class FakeConsumer:
    """The part of Celery's consumer that ``consume_only`` uses; it logs each change."""

    def __init__(self, queues: list[str]) -> None:
        self.task_consumer = SimpleNamespace(queues=[SimpleNamespace(name=q) for q in queues])
        self.log: list[str] = []

    def cancel_task_queue(self, queue: str) -> None:
        self.task_consumer.queues = [q for q in self.task_consumer.queues if q.name != queue]
        self.log.append(f"-{queue}")

    def add_task_queue(self, queue: str) -> None:
        self.task_consumer.queues.append(SimpleNamespace(name=queue))
        self.log.append(f"+{queue}")

    def call_soon(self, fun, *args) -> None:
        fun(*args)


def test_the_consume_command_sets_the_queues_in_one_step_in_order():
    from gpu_worker.control import lanes_consume

    wanted = worker_queues("gpu0@h")
    consumer = FakeConsumer(["fast", "standard.gpu0@h"])  # some still there, out of order
    reply = lanes_consume(SimpleNamespace(consumer=consumer), queues=wanted)
    assert [q.name for q in consumer.task_consumer.queues] == wanted
    assert reply == {"ok": "consuming " + ", ".join(wanted)}
    consumer.log.clear()
    lanes_consume(SimpleNamespace(consumer=consumer), queues=",".join(wanted))  # as the CLI
    assert consumer.log == []  # already so: nothing touched
    lanes_consume(SimpleNamespace(consumer=consumer), queues=[])
    assert consumer.task_consumer.queues == [] and consumer.log == [f"-{q}" for q in wanted]


# --- routing and beat leave a sick worker out ---------------------------------------

def _snapshot(now: float) -> dict:
    worker = {"alive": True, "missed": 0, "in_flight": {"fast": 1}, "queued": 0,
              "service_ms": {"fast": 500.0}, "warm_models": ["demo"], "memory_mb": 4,
              "concurrency": 1, "lanes": ["fast", "standard", "relaxed"], "sick": None}
    return {"at": now, "lanes": {}, "policy": {}, "workers": {
        "gpu0@h": worker,
        "gpu1@h": {**worker, "sick": REASON, "queued": 4, "service_ms": {"fast": 9000.0}},
        "gpu2@h": {**worker, "alive": False, "missed": 2}}}


def test_a_sick_worker_is_off_the_ring_placement_and_capacity():
    workers = _snapshot(time.time())["workers"]
    assert [serving(w) for w in workers.values()] == [True, False, False]
    view = base_view(_snapshot(time.time()))
    assert set(view.ring[1]) == {"gpu0@h"}
    assert set(view.loads) == set(view.warm) == set(view.budget_mb) == set(view.drain_s) \
        == {"gpu0@h"}
    for model in ("demo-1", "flaky"):  # every model now lands on the one serving
        assert home(model, view.ring, view.loads, view.epsilon, view.warm) == "gpu0@h"
    # warm on every serving worker (the one): the shared lane, which only it serves now
    assert home("demo", view.ring, view.loads, view.epsilon, view.warm) is None
    assert holders(workers, "demo") == ["gpu0@h"]
    assert prewarm_targets(workers, "demo", replicas=2) == []  # no serving worker to add
    assert prewarm_targets({**workers, "gpu3@h": {"alive": True}}, "demo", 2) == ["gpu3@h"]
    loads = lane_loads(workers, {"fast": 6, "standard": 0, "relaxed": 0}, default_service_s=1.0)
    assert loads["fast"]["workers"] == 1 and loads["fast"]["in_flight"] == 1
    assert loads["fast"]["service_s"] == 0.5  # the sick worker's slow runs do not count
    assert lane_loads({"gpu1@h": workers["gpu1@h"]}, {}, 1.0)["fast"]["workers"] == 0
    assert lane_loads({"gpu1@h": workers["gpu1@h"]}, {}, 1.0)["fast"]["expected_wait_s"] > 60


def test_status_and_metrics_say_why(clean_redis):
    from tasks.ops.status import render_status
    from tasks.ops.metrics import worker_metrics

    out = render_status(_snapshot(time.time()))
    rows = {line.split()[0]: line for line in out.splitlines() if line.startswith("gpu")}
    assert f"SICK: {REASON}" in rows["gpu1@h"]
    assert rows["gpu0@h"].split()[1] == "yes" and rows["gpu2@h"].split()[1] == "NO"
    (sick,) = [m for m in worker_metrics(_snapshot(time.time()))
               if m.name == "gpulanes_worker_sick"]
    assert {s.labels["worker"]: s.value for s in sick.samples} == {
        "gpu0@h": 0.0, "gpu1@h": 1.0, "gpu2@h": 0.0}


def test_beat_returns_a_sick_workers_queued_jobs_to_the_shared_lane(clean_redis, leading):
    from beat.heartbeat import heartbeat
    from tasks.jobs.schema import validate
    from tasks.worker.generate import generate

    host, own = "gpu9@sick", lane_keys(worker_queue("fast", "gpu9@sick"))[0]
    job = validate("p", tier="fast", account="a", model="demo", seed=1, **SMALL).encode()
    sent = generate.apply_async(kwargs={"job": job, "route": {"lane": "fast",
                                "requested_tier": "fast"}, "submitted_at": time.time()},
                                queue="fast")
    from tasks.broker.moves import readdress
    assert readdress(clean_redis, "fast", own, "fast") == 1  # as if routed to the sick worker
    record = {**_snapshot(time.time())["workers"]["gpu1@h"], "last_seen": time.time()}
    clean_redis.hset(WORKERS_KEY, host, json.dumps(record))
    heartbeat()  # no reply from gpu9@sick this round: alive still, and still sick
    record = json.loads(clean_redis.hget(WORKERS_KEY, host))
    assert record["alive"] and record["sick"] == REASON
    assert clean_redis.llen(own) == 0
    (moved,) = [json.loads(raw) for raw in clean_redis.lrange("fast", 0, -1)]
    assert moved["headers"]["id"] == sent.id
    assert moved["properties"]["delivery_info"]["routing_key"] == "fast"


# --- on real workers ----------------------------------------------------------------

def _record(client, host: str) -> dict:
    return json.loads(client.hget(WORKERS_KEY, host) or "{}")


def _router_sees(hosts: list[str]) -> bool:
    from tasks.broker.view import snapshot_cache
    view = snapshot_cache().view()
    return bool(view) and set(view.ring[1]) == set(hosts)


def _status_row(host: str) -> str:
    """``host``'s row in ``celery -A tasks lanes status``, run for real."""
    status = subprocess.run([sys.executable, "-m", "celery", "-A", "tasks", "lanes", "status"],
                            cwd=PROJECT_DIR, capture_output=True, text=True, timeout=60)
    rows = [line for line in status.stdout.splitlines() if line.startswith(host)]
    assert len(rows) == 1, status.stdout + status.stderr
    return rows[0]


@pytest.fixture(scope="module")
def cluster(cluster_factory):
    return cluster_factory(workers=2, beat=True)


@pytest.mark.cluster
@pytest.mark.timeout(420)
def test_a_worker_with_a_broken_disk_steps_aside_and_comes_back(cluster, clean_redis):
    from tasks import submit
    from tasks.broker.view import snapshot_cache
    from tasks.jobs.deadletter import dead_jobs
    from tests.flaky_model import break_disk, mend_disk, scratch_dir

    hosts = cluster.hostnames
    wait_until(lambda: _router_sees(hosts), timeout_s=60, what="the router to see both workers")
    broken = home("flaky", ring(hosts), {}, 0.25)  # the one to break: flaky's first on the ring
    (healthy,) = set(hosts) - {broken}
    break_disk(broken)
    try:
        results = [submit(f"io job {i}", model="flaky", seed=i, **SMALL) for i in range(40)]
        outs = [r.get(timeout=240) for r in results]
        assert len({o["job_id"] for o in outs}) == 40  # every job completed...
        assert {o["worker"] for o in outs} == {healthy}  # ...on the healthy worker
        assert dead_jobs(clean_redis) == []
        # sick, and consuming nothing: its consumer thread drops the queues when told,
        # so a heartbeat may come between the two
        record = wait_until(lambda: (r := _record(clean_redis, broken)).get("sick")
                            and r.get("queues") == [] and r,
                            timeout_s=30, what=f"{broken} to report itself sick, consuming nothing")
        assert str(scratch_dir(broken)) in record["sick"] and "Error" in record["sick"]
        assert record["alive"]
        assert record["worker_faults"] >= SICK_AFTER
        row = _status_row(broken)
        assert row.split()[1] == "SICK:" and str(scratch_dir(broken)) in row
    finally:
        mend_disk(broken)
    # at its next self-check (plus a heartbeat) it serves again, queues in order: the
    # checks back off while they fail (doubling each time), a minute apart at most
    wait_until(lambda: (r := _record(clean_redis, broken)).get("queues") == worker_queues(broken)
               and not r.get("sick"), timeout_s=75, what=f"{broken} to consume again, in order")
    snapshot_cache().forget()  # a fresh router: both workers on the ring again
    wait_until(lambda: _router_sees(hosts), timeout_s=30, what="the router to see both again")
    # flaky is warm on both: its jobs take the shared lane, and the mended worker runs its
    # share again (Redis hands a push to the worker that has waited longest)
    outs = [r.get(timeout=60) for r in [submit(f"io job after the repair {i}", model="flaky",
                                               seed=100 + i, **SMALL) for i in range(10)]]
    assert broken in {o["worker"] for o in outs}
