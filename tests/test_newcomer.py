"""What a newcomer meets first: a bad setting stops ``lanes up`` and a console worker at
once, a supervisor that exits early shows why, ``lanes submit`` takes any model's inputs
and prints a bare id for scripts, ``lanes cancel`` and ``lanes job`` tell known jobs from
unknown ones, counts read right in the singular, and a resumable model is preemptible.

No cluster here: the processes fail before anything starts, and the jobs stay queued.
"""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

from routing.names import LANES
from tasks.broker.keys import (
    LANE_DEPTHS_KEY,
    REVOKED_KEY,
    held_key,
    lane_keys,
    run_key,
)

PROJECT_DIR = Path(__file__).resolve().parent.parent
#: Warm models that no settings accept: more than GPULANES_MODEL_MEMORY_MB holds.
TOO_MANY_WARM = {"GPULANES_WARM_MODELS": "demo,demo-0,demo-1", "GPULANES_MODEL_MEMORY_MB": "4"}
#: A warm model GPULANES_MODELS does not name (the default ``demo`` once it is left out).
UNKNOWN_WARM = {"GPULANES_MODELS": "echo=tasks.models.echo:Echo", "GPULANES_WARM_MODELS": "demo"}


def run(args: list[str], env: dict[str, str] | None = None,
        timeout_s: float = 60) -> subprocess.CompletedProcess:
    return subprocess.run(args, cwd=PROJECT_DIR, capture_output=True, text=True,
                          timeout=timeout_s, env=env)


def lanes(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    return run([sys.executable, "-m", "celery", "-A", "tasks", "lanes", *args], env)


def own_cluster_env(state_dir: Path, **changes: str) -> dict[str, str]:
    """The test environment for a ``lanes up`` of its own: its own state folder, no
    broker URL (it starts its own Redis there)."""
    env = {k: v for k, v in os.environ.items() if k != "GPULANES_BROKER_URL"}
    return {**env, "GPULANES_STATE_DIR": str(state_dir), **changes}


def queued(client) -> list[bytes]:
    """Every message waiting in a lane's shared lists."""
    return [raw for lane in LANES for key in lane_keys(lane) for raw in client.lrange(key, 0, -1)]


def one_line_error(proc: subprocess.CompletedProcess) -> str:
    """The one line a command that failed cleanly wrote to stderr."""
    assert proc.returncode != 0, proc.stdout
    assert "Traceback" not in proc.stderr, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr
    return lines[0]


# --- a bad setting, a supervisor that exits -------------------------------------

@pytest.mark.parametrize("bad", [TOO_MANY_WARM, UNKNOWN_WARM], ids=["too-many", "unknown"])
def test_lanes_up_with_a_bad_setting_fails_at_once_naming_it(tmp_path, bad):
    began = time.monotonic()
    proc = lanes("up", "--workers", "1", "--device", "cpu", env=own_cluster_env(tmp_path, **bad))
    assert one_line_error(proc).startswith("Error: GPULANES_WARM_MODELS: ")
    assert "starting" not in proc.stdout and not (tmp_path / "redis.sock").exists()
    assert time.monotonic() - began < 30  # no wait for workers: nothing started


@pytest.mark.parametrize("bad", [TOO_MANY_WARM, UNKNOWN_WARM], ids=["too-many", "unknown"])
def test_a_console_worker_with_a_bad_setting_exits_78_at_once(tmp_path, bad):
    proc = run([sys.executable, "-m", "gpu_worker", "--workers", "1", "--device", "cpu"],
               env=own_cluster_env(tmp_path, **bad))
    assert proc.returncode == 78  # EX_CONFIG: systemd and Docker see a configuration error
    assert one_line_error(proc).startswith("python -m gpu_worker: GPULANES_WARM_MODELS: ")
    assert not (tmp_path / "redis.sock").exists()


def test_lanes_up_with_a_model_that_cannot_import_fails_at_once(tmp_path):
    env = own_cluster_env(tmp_path, GPULANES_MODELS="mine=no_such_module:Mine",
                          GPULANES_WARM_MODELS="mine")
    error = one_line_error(lanes("up", "--workers", "1", "--device", "cpu", env=env))
    assert "'no_such_module:Mine' (GPULANES_MODELS)" in error
    assert not (tmp_path / "redis.sock").exists()


def test_lanes_up_shows_the_end_of_the_workers_log_when_the_supervisor_exits(tmp_path):
    # More workers than GPUs (none here): the supervisor refuses at once, and says why
    # in its log only; `up` has started Redis and beat by then, and stops them.
    proc = lanes("up", "--workers", "64", "--device", "cuda", env=own_cluster_env(tmp_path))
    assert proc.returncode != 0 and "Traceback" not in proc.stderr, proc.stderr
    assert "starting embedded Redis, 64 workers and beat" in proc.stdout
    assert re.search(rf"the worker supervisor exited with \d+; the end of {tmp_path}/workers.log:",
                     proc.stderr), proc.stderr
    said = proc.stderr.split("workers.log:", 1)[1]
    assert "python -m gpu_worker: GPULANES_DEVICE: cuda was asked for" in said \
        or "but only 1 GPU is visible" in said, proc.stderr
    assert not (tmp_path / "redis.sock").exists()  # its Redis stopped with it


# --- submit any model, for scripts ---------------------------------------------

def test_submit_no_wait_prints_the_bare_id_of_any_models_job(clean_redis):
    from tasks.broker import envelope

    proc = lanes("submit", "--model", "echo", "--input", "text=2", "--input", "repeat=2",
                 "--no-wait")
    assert proc.returncode == 0, proc.stderr
    job_id = proc.stdout.strip()
    assert proc.stdout == f"{job_id}\n" and uuid.UUID(job_id)
    assert json.loads(lanes("job", job_id, "--json").stdout)["state"] == "QUEUED"
    [raw] = queued(clean_redis)
    job = envelope.call(envelope.decode(raw))[1]["job"]
    assert (job["model"], job["text"], job["repeat"]) == ("echo", "2", 2)  # typed by Input

    answer = lanes("submit", "a lighthouse", "--steps", "4", "--width", "64", "--height", "64",
                   "--no-wait", "--json")
    assert answer.returncode == 0, answer.stderr
    assert set(json.loads(answer.stdout)) == {"id"}


@pytest.mark.parametrize("args, field", [
    (("--input", "text=hi", "--input", "repeat=9"), "repeat"),
    (("--input", "text=hi", "--input", "colour=red"), "colour"),
    (("--input", "text"), "input"),
    (("--input", "text=a", "--input-json", '{"text": "b"}'), "text"),
    (("--input-json", "[1]"), "input-json"),
    (("hello",), "prompt"),  # a class model takes no prompt argument
    (("--input", "text=hi", "--input", "tier=fast"), "tier"),  # routing, not an input
])
def test_submit_with_a_bad_input_names_it_and_enqueues_nothing(clean_redis, args, field):
    error = one_line_error(lanes("submit", "--model", "echo", *args, "--no-wait"))
    assert error.startswith(f"Error: {field}: "), error
    assert not queued(clean_redis) and not clean_redis.hgetall(LANE_DEPTHS_KEY)


def test_inputs_are_typed_by_the_models_input(tmp_path):
    from tasks.ops.inputs import parse_inputs

    nested = tmp_path / "part.json"
    nested.write_text('{"ratio": 0.5, "tags": ["a"]}')
    given = parse_inputs("typed", ["count=3", "text=3", "number=1.5", "items=[1, \"x\"]",
                                   f"part=@{nested}", "anything=plain words"],
                         '{"mapping": {"k": [1]}}')
    assert given == {"mapping": {"k": [1]}, "count": 3, "text": "3", "number": 1.5,
                     "items": [1, "x"], "part": {"ratio": 0.5, "tags": ["a"]},
                     "anything": "plain words"}
    assert parse_inputs("demo", ["prompt=42", "steps=4"], None) == {"prompt": "42", "steps": 4}


# --- cancel and job: known and unknown ids --------------------------------------

def test_cancel_of_an_id_nobody_submitted_fails_and_records_no_revoke(clean_redis):
    proc = lanes("cancel", "not-a-real-id")
    assert proc.returncode == 1
    assert one_line_error(proc) == ("Error: no job not-a-real-id: never submitted, or its "
                                    "records expired (results are kept GPULANES_RESULT_TTL_S)")
    assert clean_redis.zcard(REVOKED_KEY) == 0
    assert "unknown here" in lanes("job", "not-a-real-id").stdout


def test_cancel_of_queued_jobs_says_so_and_counts_read_right(app, clean_redis):
    from tasks import submit

    first, second = (submit("queued", seed=i, steps=4, width=64, height=64) for i in (1, 2))
    assert ", 1 job ahead" in lanes("job", second.id).stdout
    proc = lanes("cancel", first.id, "not-a-real-id")
    assert proc.returncode == 1  # one unknown id among them
    assert proc.stdout == (f"job {first.id}: cancelled while queued in the standard lane; "
                           "it will not run\n")
    assert "no job not-a-real-id" in proc.stderr
    assert clean_redis.zscore(REVOKED_KEY, first.id) and not clean_redis.zscore(REVOKED_KEY,
                                                                             "not-a-real-id")


def _message(job_id: str) -> str:
    return json.dumps({"body": "", "headers": {"id": job_id, "task": "t"},
                       "properties": {"delivery_tag": str(uuid.uuid4())}})


def _taken(client, job_id: str) -> None:
    """Taken by a worker process: its message in that holder's records."""
    from tasks.broker import handover

    handover.push(client, "fast", _message(job_id))
    handover.take(client, "gpu0@h/1/1.0", ["fast"], "token")
    assert client.hlen(held_key("gpu0@h/1/1.0")) == 1


@pytest.mark.parametrize("record, state", [
    (_taken, "TAKEN"),
    (lambda c, j: c.hset(run_key("leader-id"), f"f:{j}", "{}"), "FOLLOWING"),
    (lambda c, j: c.set(f"gpulanes:attempts:{j}", 1), "ACCEPTED"),
], ids=["held", "follower", "attempts"])
def test_a_job_the_broker_records_is_known_without_a_result(app, clean_redis, record, state):
    from tasks.ops.records import describe

    job_id = str(uuid.uuid4())
    assert describe(app, clean_redis, job_id)["state"] == "PENDING"
    record(clean_redis, job_id)
    assert describe(app, clean_redis, job_id)["state"] == state


def test_plural_reads_right_in_the_singular():
    from tasks.ops.group import plural

    assert [plural(n, "job") for n in (0, 1, 2)] == ["0 jobs", "1 job", "2 jobs"]
    assert plural(1.0, "fast second") == "1 fast second"
    assert plural(0.5, "fast second") == "0.5 fast seconds"
    assert plural(1, "replica", "replicas!") == "1 replica"


# --- a resumable model is preemptible --------------------------------------------

class Resumable:
    """A class model that can resume and says nothing of preemption."""

    from tasks.models.echo import EchoInput as Input
    resumable = True

    def __init__(self) -> None:
        self.device = "cpu"

    def predict(self, inputs, progress, resume=None) -> dict:
        progress(1, 1, "state after step 1")
        return {"text": inputs.text}


class ResumableNotPreemptible(Resumable):
    preemptible = False


class Plain(Resumable):
    resumable = False


class PreemptibleOnly(Plain):
    preemptible = True


@pytest.mark.parametrize("cls, preemptible", [
    (Resumable, True), (ResumableNotPreemptible, False), (Plain, False),
    (PreemptibleOnly, True)])
def test_a_resumable_model_is_preemptible_unless_it_says_not(monkeypatch, cls, preemptible):
    from gpu_worker.lease import Lease
    from gpu_worker.preempt import PREEMPTION
    from gpu_worker.runtime import RUNTIME
    from tasks.broker.message import Job
    from tasks.worker.execute import run_job
    from tasks.worker.steps import StepGuard

    offered: list[str] = []
    monkeypatch.setattr(RUNTIME, "model", lambda name: (cls(), None))
    monkeypatch.setattr(PREEMPTION, "offer", lambda lane, preempted, step: offered.append(lane))
    monkeypatch.setattr(PREEMPTION, "withdraw", lambda: None)
    job = Job(tier="relaxed", account="a", model="echo", downgradable=True,
              inputs={"text": "hi", "repeat": 1})
    guard = StepGuard("j1", Lease("j1", 1, "h#1#t", time.monotonic()), "relaxed", 0,
                      lambda step, steps: None)
    ran = run_job(job, "relaxed", guard)
    assert ran.output == {"text": "hi"} and guard.preemptible is preemptible
    assert offered == (["relaxed"] if preemptible else [])  # in the index of preemptible runs
