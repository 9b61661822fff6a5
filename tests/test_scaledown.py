"""Scaling a fleet on real processes: one supervisor per worker (``python -m gpu_worker
--workers 1 --instance NAME``, several on this host), as Kubernetes runs one pod per GPU.

A scale-down (SIGTERM to three of four supervisors while each runs a job) loses no job
and runs none twice to its end: each stopped worker hands its job on at its next step
and exits within a couple of step times. A worker added under load takes its first job
only once its models are warm.
"""
from __future__ import annotations

import os
import re
import signal
import time
from pathlib import Path

import pytest
from conftest import STATE_DIR, wait_until

from gpu_worker.__main__ import children, parse_args
from gpu_worker.launcher import worker_node
from tasks.dev.cluster import LocalCluster
from tests.harness.faults import JobStream, settle
from tests.slow_models import WARM_LOAD_S, WARMED_FILE_ENV

pytestmark = pytest.mark.cluster
#: A job of 1.6 s, with steps to hand on at: steps that take a set time, as a GPU's
#: do, so that five workers on a small host do not share its cores.
JOB = dict(model="paced", tier="relaxed", steps=40, step_ms=40)
#: Longer jobs while a worker is added: a queue that outlasts its start.
LONGER_JOB = {**JOB, "steps": 60, "step_ms": 50}
LEAVING, SURVIVOR = ("a", "b", "c"), "d"
#: Beyond two step times, what a stopping worker may take to exit: handing its state on,
#: Celery's warm shutdown, unloading its models. Generous: a bound, not a measurement.
STOP_SLACK_S = 8.0


class Instance(LocalCluster):
    """One single-worker supervisor, ``--instance name``, on the session's Redis."""

    def __init__(self, name: str, env: dict[str, str] | None = None,
                 beat: bool = False) -> None:
        super().__init__(STATE_DIR, workers=1, device="cpu", beat=beat,
                         env={"GPULANES_WARM_MODELS": "paced", **(env or {})},
                         log_dir=STATE_DIR / "logs" / f"scaledown-{name}")
        self.name = name

    @property
    def hostnames(self) -> list[str]:
        return [worker_node(0, self.name)]

    @property
    def host(self) -> str:
        return self.hostnames[0]

    def start_workers(self) -> None:
        self.supervisor = self._spawn("workers", ["-m", "gpu_worker", "--workers", "1",
                                                  "--device", "cpu", "--instance", self.name])
        if self.with_beat and self.beat is None:
            self.beat = self._spawn("beat", ["-m", "celery", "-A", "tasks", "beat"])

    def log(self) -> str:
        return (self.log_dir / "workers.log").read_text(errors="replace")


@pytest.fixture(scope="module")
def fleet(redis_server, app):
    """Four supervisors, started side by side; beat beside the one that stays."""
    started = {name: Instance(name, beat=name == SURVIVOR) for name in (*LEAVING, SURVIVOR)}
    for instance in started.values():
        instance.start_workers()
    try:
        for instance in started.values():
            instance.wait_for_workers(app, instance.hostnames, timeout_s=120)
        yield started
    finally:
        for instance in started.values():
            instance.stop()


def progress(result) -> dict | None:
    """``result``'s progress info while it runs (state and info in one read)."""
    meta = result.backend.get_task_meta(result.id)
    return meta.get("result") if meta.get("status") == "PROGRESS" else None


def test_supervisors_named_apart_give_their_workers_distinct_names(capsys):
    def names(*argv: str) -> list[str]:
        args = parse_args(["--workers", "2", "--device", "cpu", *argv])
        return [c.command[c.command.index("--hostname") + 1] for c in children(args)]

    host = os.uname().nodename
    assert names() == [f"gpu0@{host}", f"gpu1@{host}"]  # unchanged without the option
    assert names("--instance", "a") == [f"gpu0-a@{host}", f"gpu1-a@{host}"]
    assert set(names("--instance", "a")).isdisjoint(names("--instance", "b"))
    queues = next(c for c in children(parse_args(["--device", "cpu", "--instance", "b"])))
    assert f"fast.gpu0-b@{host}" in queues.command[queues.command.index("--queues") + 1]
    with pytest.raises(SystemExit):
        parse_args(["--instance", "a@b"])  # would break the node name
    assert "argument --instance: 'a@b'" in capsys.readouterr().err


def _running_by_worker(jobs: list, workers: int) -> dict[str, dict]:
    """``{worker: progress info and job id}`` once ``workers`` workers each run one of
    ``jobs``, well inside it."""
    def running() -> dict[str, dict] | None:
        found = {}
        for job in jobs:
            info = progress(job)
            # past its first steps, with steps left to hand on at (not about to end)
            if info and not info.get("paused") and 2 <= info.get("step", 0) <= info["steps"] - 10:
                found[info["worker"]] = {**info, "job": job.id}
        return found if len(found) >= workers else None
    return wait_until(running, 60, f"{workers} workers each running a job")


def test_a_scale_down_hands_every_job_on_and_the_stopped_workers_exit(fleet, clean_redis,
                                                                         app):
    stream = JobStream(lambda i: {"n": i, **JOB})
    for _ in range(12):  # 4 running, 8 queued
        assert stream.submit_one() is not None
    running = _running_by_worker(list(stream.accepted.values()), len(fleet))
    leaving = {name: fleet[name] for name in LEAVING}
    sent = {}
    for name, instance in leaving.items():
        instance.supervisor.send_signal(signal.SIGTERM)  # as Kubernetes stops a pod
        sent[name] = time.monotonic()
    step_s = max(info["running_s"] / info["step"] for info in running.values())
    exited: dict[str, float] = {}

    def all_exited() -> bool:
        for name, instance in leaving.items():
            if name not in exited and instance.supervisor.poll() is not None:
                exited[name] = time.monotonic() - sent[name]
        return len(exited) == len(leaving)
    wait_until(all_exited, 2 * step_s + STOP_SLACK_S + 30, "the stopped supervisors to exit")
    print(f"\nstep {step_s:.3f}s; SIGTERM to exit: "
          + ", ".join(f"{name} {s:.2f}s" for name, s in sorted(exited.items())))
    assert {name: i.supervisor.returncode for name, i in leaving.items()} == \
        dict.fromkeys(LEAVING, 0)
    assert max(exited.values()) < 2 * step_s + STOP_SLACK_S

    counts = settle(stream, "scale-down", clean_redis, timeout_s=180)
    assert (counts.accepted, counts.completed) == (12, 12), counts
    assert counts.lost == counts.failed == counts.falsely_failed == 0, counts
    assert counts.duplicated == 0  # no job ran to its end twice
    outs = {job_id: r.get(timeout=5) for job_id, r in stream.accepted.items()}
    handed = {running[fleet[n].host]["job"] for n in LEAVING}
    assert {i for i, out in outs.items() if out["preempted"]} == handed
    assert counts.rerun == len(handed)  # only they ran twice: stepped aside, then resumed
    assert all(out["attempts"] == 1 + out["preempted"] for out in outs.values())
    survivor = fleet[SURVIVOR]
    assert {outs[i]["worker"] for i in handed} == {survivor.host}
    log = survivor.log()
    for name in LEAVING:
        info = running[fleet[name].host]
        assert f"job {info['job']} stepped aside at step " in fleet[name].log()
        resumed = re.search(rf"job {info['job']} resumes at step (\d+)", log)
        assert resumed and int(resumed.group(1)) >= info["step"]  # no step run again
    answering = {host for reply in app.control.ping(timeout=0.5) for host in reply}
    assert answering == {survivor.host}  # the stopped ones left for good


def test_a_worker_added_under_load_takes_its_first_job_once_warm(fleet, clean_redis, app):
    warmed_file = STATE_DIR / "late-warmed"
    warmed_file.unlink(missing_ok=True)
    stream = JobStream(lambda i: {"n": i, **LONGER_JOB})
    for _ in range(16):
        stream.submit_one()
    models = f"{os.environ['GPULANES_MODELS']},slow-warm=tests.slow_models:SlowWarm"
    late = Instance("late", env={"GPULANES_MODELS": models, WARMED_FILE_ENV: str(warmed_file),
                                 "GPULANES_WARM_MODELS": "paced,slow-warm"})
    fleet["late"] = late  # stopped with the rest
    began = time.monotonic()
    late.start_workers()
    late.wait_for_workers(app, late.hostnames, timeout_s=120)
    ready_s = time.monotonic() - began
    counts = settle(stream, "added", clean_redis, timeout_s=180)
    assert counts.completed == counts.accepted == 16 and counts.duplicated == 0, counts
    outs = [r.get(timeout=5) for r in stream.accepted.values()]
    taken = sorted((out for out in outs if out["worker"] == late.host),
                   key=lambda out: out["started_at"])
    assert taken, "the added worker took no job"
    first, warmed_at = taken[0], float(Path(warmed_file).read_text())
    submitted_at = first["started_at"] - first["queued_ms"] / 1000
    print(f"\nadded worker ready after {ready_s:.1f}s; after its first job's submit, warm "
          f"at +{warmed_at - submitted_at:.2f}s, the job began at "
          f"+{first['started_at'] - submitted_at:.2f}s; it ran {len(taken)} of {len(outs)}")
    assert submitted_at < warmed_at - WARM_LOAD_S  # it waited while the worker loaded
    assert first["started_at"] >= warmed_at  # and was not taken before it was warm
    assert not first["cold_start"]


def test_a_stopped_workers_job_is_resumed_at_once_by_an_idle_one_bit_for_bit(fleet, app):
    """One job, two idle workers (those the tests above left running): SIGTERM to the one
    that runs it. The other takes its next copy at once and resumes it at the step it
    stepped aside at; the output is the one of a run never stopped (here, on this CPU)."""
    from gpu_worker.models import load_model
    from tasks import submit
    from tasks.settings import settings

    running = [i for i in fleet.values() if i.supervisor.poll() is None]
    assert len(running) >= 2, "needs two workers running"
    inputs = {**JOB, "n": 4242}
    job = submit(**inputs)
    (holder, info), = _running_by_worker([job], 1).items()
    stopped = next(i for i in running if i.host == holder)
    stopped.supervisor.send_signal(signal.SIGTERM)
    sent = time.time()
    out = job.get(timeout=60)
    handed_s = out["started_at"] - sent  # to the start of the next run, elsewhere
    wait_until(lambda: stopped.supervisor.poll() is not None, 30, "the stopped one to exit")
    print(f"\nSIGTERM at step {info['step']}: resumed elsewhere {handed_s:.3f}s later; "
          f"the stopped supervisor exited {time.time() - sent:.2f}s after it")
    assert out["worker"] != holder and (out["attempts"], out["preempted"]) == (2, 1)
    resumed = re.search(rf"job {job.id} resumes at step (\d+)",
                        "".join(i.log() for i in running if i is not stopped))
    assert resumed and int(resumed.group(1)) >= info["step"]  # no step run again
    assert 0 < handed_s < 2.0  # handed on, at once (a sanity bound: measured about 0.1 s)
    paced = load_model("paced", settings.models, "cpu", STATE_DIR)  # as a worker does
    fields = {k: v for k, v in inputs.items() if k in paced.Input.model_fields}
    alone = paced.predict(paced.Input(**{**fields, "step_ms": 1}), lambda *_: None)
    assert out["output"] == alone  # bit for bit, as if never stopped
