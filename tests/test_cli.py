"""``celery -A tasks lanes ...`` run for real, in a subprocess, against the test Redis."""
from __future__ import annotations

import hashlib
import json
import os
import re
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest
from conftest import free_port, http_status, wait_until

from routing.names import LANES
from tasks.broker.keys import (
    BEAT_EPOCH_KEY,
    BEAT_LEADER_KEY,
    DEAD_KEY,
    LANE_DEPTHS_KEY,
    SNAPSHOT_KEY,
    WORKERS_KEY,
    lane_keys,
)

PROJECT_DIR = Path(__file__).resolve().parent.parent


def lanes(*args: str) -> subprocess.CompletedProcess:
    """Run one ``lanes`` sub-command with the test environment (set by conftest)."""
    return subprocess.run([sys.executable, "-m", "celery", "-A", "tasks", "lanes", *args],
                          cwd=PROJECT_DIR, capture_output=True, text=True, timeout=60)


def ok(*args: str) -> str:
    proc = lanes(*args)
    assert proc.returncode == 0, proc.stderr
    return proc.stdout


def failed(*args: str) -> str:
    """stderr of a command that must fail cleanly: non-zero, one message, no traceback."""
    proc = lanes(*args)
    assert proc.returncode != 0, proc.stdout
    assert "Traceback" not in proc.stderr
    return proc.stderr


def bury_one(client, reason: str = "retries_exhausted") -> str:
    """A fast job that ran out of retries, as ``generate`` buries it; its id."""
    from tasks.errors import TransientJobError
    from tasks.jobs.deadletter import bury
    from tasks.jobs.schema import validate

    job = validate("a lighthouse at dusk", tier="fast", account="alice", model="demo",
                   seed=7, steps=4, width=64, height=64).encode()
    job_id = str(uuid.uuid4())
    try:
        try:
            raise RuntimeError("CUDA out of memory. Tried to allocate 2.00 GiB")
        except RuntimeError as cause:
            raise TransientJobError("out of memory on cuda:0") from cause
    except TransientJobError as exc:
        error = exc
    kwargs = {"job": job, "route": {"lane": "fast", "requested_tier": "fast"},
              "submitted_at": time.time() - 30}
    bury(client, job_id, kwargs, reason, error, attempts=4)
    return job_id


def test_help_lists_the_sub_commands():
    out = ok("--help")
    assert "gpulanes: status, jobs, a local cluster, metrics" in out
    for command in ("accounts", "dead", "exporter", "prewarm", "status", "submit", "unpin",
                    "up"):
        assert f"\n  {command} " in out


def test_grant_show_and_list_agree_and_exhaustion_flips():
    from tasks.settings import settings

    start = settings.fast_seconds_default
    assert "alice: 10 fast seconds left" in ok("accounts", "grant", "alice", str(10 - start))
    shown = ok("accounts", "show", "alice")
    assert "alice: 10 fast seconds left" in shown and "exhausted" not in shown
    assert json.loads(ok("accounts", "list", "--json")) == [
        {"account": "alice", "fast_seconds_left": 10.0, "exhausted": False}]

    assert "alice: -0.5 fast seconds left (exhausted" in ok("accounts", "grant", "alice",
                                                            "-10.5")
    row = ok("accounts", "list").splitlines()[2].split()
    assert row == ["alice", "-0.5", "yes"]


@pytest.mark.parametrize("args, field", [(("bad name", "5"), "account"),
                                         (("alice", "lots"), "seconds")])
def test_bad_grant_is_a_clean_error_naming_the_field(clean_redis, args, field):
    assert f"Error: {field}: " in failed("accounts", "grant", *args)
    assert clean_redis.hlen("gpulanes:fast:balance") == 0


def test_dead_list_then_requeue_moves_the_job_onto_its_lane(clean_redis):
    job_id = bury_one(clean_redis)
    out = ok("dead", "list", "--traceback")
    row = next(line for line in out.splitlines() if line.startswith(job_id)).split()
    assert row[2:4] == ["retries_exhausted", "TransientJobError:"]
    assert row[-3:] == ["4", "fast", "fast"]
    assert "RuntimeError: CUDA out of memory" in out  # the cause, from --traceback

    assert ok("dead", "requeue", job_id).startswith(job_id)
    assert not clean_redis.hexists(DEAD_KEY, job_id)
    assert int(clean_redis.hget(LANE_DEPTHS_KEY, "fast")) == 1


def test_requeue_of_an_unknown_job_fails_and_moves_nothing(clean_redis):
    job_id = bury_one(clean_redis)
    assert "no dead job 'no-such-job'" in failed("dead", "requeue", job_id, "no-such-job")
    assert clean_redis.hexists(DEAD_KEY, job_id)
    assert not clean_redis.hexists(LANE_DEPTHS_KEY, "fast")


def test_status_without_a_snapshot_says_beat_is_not_running():
    proc = lanes("status")
    assert proc.returncode == 1
    assert "no load snapshot" in proc.stderr and "beat" in proc.stderr


def snapshot_at(now: float) -> dict:
    """A snapshot as beat writes it: fast overloaded, one worker alive, one dead."""
    load = {"depth": 0, "in_flight": 0, "workers": 2, "service_s": 0.8, "expected_wait_s": 0.0}
    worker = {"alive": True, "missed": 0, "device": "cuda:0", "warm_models": ["demo"],
              "in_flight": {"fast": 1, "standard": 1}, "service_ms": {"fast": 800.0},
              "lanes": ["fast", "standard", "relaxed"], "last_seen": now}
    return {
        "at": now,
        "lanes": {"fast": {**load, "depth": 42, "in_flight": 1, "expected_wait_s": 16.8},
                  "standard": {**load, "depth": 3, "in_flight": 1, "expected_wait_s": 2.4},
                  "relaxed": {**load, "depth": 7}},
        "policy": {"fast": {"overloaded": True, "calm_samples": 0},
                   "standard": {"overloaded": False, "calm_samples": 2}},
        "workers": {"gpu0@host": worker,
                    "gpu1@host": {**worker, "alive": False, "missed": 2, "device": "cuda:1",
                                  "in_flight": {}, "last_seen": now - 2}},
        "exhausted": ["bob"], "levels": {"carol": 2}}


def test_status_prints_each_lane_and_worker(clean_redis):
    snapshot = snapshot_at(time.time())
    workers = snapshot.pop("workers")  # beat keeps the records apart from what routers read
    clean_redis.set(SNAPSHOT_KEY, json.dumps(snapshot))
    clean_redis.hset(WORKERS_KEY, mapping={h: json.dumps(w) for h, w in workers.items()})
    assert "beat: no leader now (last epoch 0)" in ok("status")
    clean_redis.set(BEAT_LEADER_KEY, "beathost/42/ab12cd34")
    clean_redis.set(BEAT_EPOCH_KEY, 7)
    out = ok("status")
    assert out.splitlines()[1] == "beat: led by beathost/42/ab12cd34, epoch 7"
    *tables, footer = out.splitlines()
    rows = {line.split()[0]: line.split() for line in tables if line}
    assert rows["fast"][1:] == ["42", "1", "2", "800ms", "16.8s", "YES"]
    assert rows["standard"][-1] == "no" and rows["relaxed"][-1] == "-"
    assert rows["gpu0@host"][1:] == ["yes", "cuda:0", "2", "demo"]
    assert rows["gpu1@host"][1:3] == ["NO", "(missed"]
    assert footer == "fast time exhausted: bob"


@pytest.fixture(scope="module")
def cluster(cluster_factory):
    """One worker for the module's tests that run jobs."""
    return cluster_factory(workers=1)


@pytest.mark.cluster
def test_submit_follows_the_job_and_prints_its_png(cluster, clean_redis):
    out = ok("submit", "a fox in the snow", "--tier", "fast", "--seed", "3", "--steps", "4",
             "--width", "64", "--height", "64")
    assert re.search(r"^(queued \.\.\.|running \.\.\.|done)$", out, re.M)  # a line a state
    assert "ran in the fast lane on gpu0@" in out
    found = re.search(r"^image: (\S+) \(\d+ bytes, sha256 ([0-9a-f]{64})\)$", out, re.M)
    png = Path(found.group(1))
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert hashlib.sha256(png.read_bytes()).hexdigest() == found.group(2)


@pytest.mark.cluster
def test_submit_any_model_with_inputs_and_read_its_output(cluster, clean_redis):
    out = ok("submit", "--model", "echo", "--input", "text=ab", "--input", "repeat=2",
             "--tier", "fast")
    assert "\noutput.text: abab\nran in the fast lane on gpu0@" in out
    answer = json.loads(ok("submit", "--model", "echo", "--input-json", '{"text": "x"}',
                           "--json"))
    assert answer["result"]["output"] == {"text": "x"} and answer["result"]["lane"] == "standard"
    assert answer["id"] == answer["result"]["job_id"]


@pytest.mark.cluster
def test_job_shows_a_finished_jobs_artifacts_and_cancel_says_it_finished(cluster, app,
                                                                        clean_redis):
    job_id = ok("submit", "--model", "blob", "--input", "tag=cli-job", "--input",
                "size_bytes=16", "--no-wait").strip()
    out = app.AsyncResult(job_id).get(timeout=60)
    ref = out["output"]["blob"]
    shown = ok("job", job_id)
    assert shown.startswith(f"job {job_id}: done in the standard lane on gpu0@")
    assert shown.splitlines()[1] == (f"output.blob: {ref['url']} (application/octet-stream, "
                                     f"16 bytes, sha256 {ref['sha256']})")
    assert hashlib.sha256(Path(ref["url"]).read_bytes()).hexdigest() == ref["sha256"]
    assert ok("cancel", job_id) == f"job {job_id}: already finished; nothing to cancel\n"
    assert not clean_redis.zscore("gpulanes:revoked", job_id)


def test_submit_with_a_bad_field_names_it_and_enqueues_nothing(clean_redis):
    assert "steps" in failed("submit", "x", "--steps", "0")
    assert "tier" in failed("submit", "x", "--tier", "turbo")
    assert not any(clean_redis.llen(key) for lane in LANES for key in lane_keys(lane))


@pytest.mark.cluster
def test_up_runs_a_cluster_with_flower_and_metrics_until_ctrl_c(tmp_path):
    env = {k: v for k, v in os.environ.items()
           if k not in ("GPULANES_BROKER_URL", "FLOWER_BASIC_AUTH")}
    env["GPULANES_STATE_DIR"] = str(tmp_path)
    flower_port, metrics_port = free_port(), free_port()
    proc = subprocess.Popen([sys.executable, "-m", "celery", "-A", "tasks", "lanes", "up",
                             "--workers", "1", "--device", "cpu", "--flower-port",
                             str(flower_port), "--metrics-port", str(metrics_port)],
                            cwd=PROJECT_DIR, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, start_new_session=True,
                            # as a shell's background job starts it: Ctrl-C must still stop it
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_IGN))
    try:
        lines = []
        while not lines or "Ctrl-C" not in lines[-1]:
            line = proc.stdout.readline()
            assert line, "".join(lines)  # it exited early
            lines.append(line)
        login = re.search(r"\(login (\S+)\)", "".join(lines)).group(1)
        flower = f"http://127.0.0.1:{flower_port}/workers"
        wait_until(lambda: http_status(flower) == 401, timeout_s=60, what="Flower to refuse strangers")
        assert http_status(flower, login) == 200
        assert http_status(f"http://127.0.0.1:{metrics_port}/metrics") == 200
    finally:
        proc.send_signal(signal.SIGINT)
        try:
            out, _ = proc.communicate(timeout=90)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)  # its children die with it (PDEATHSIG)
            from tasks.dev.cluster import log_tail

            logs = "\n".join(f"{path.name}:\n{log_tail(path, 20)}"
                             for path in sorted(tmp_path.rglob("*.log")))
            raise AssertionError(f"lanes up still ran 90 s after Ctrl-C; its logs:\n{logs}")
    assert proc.returncode == 0, out
    assert not (tmp_path / "redis.sock").exists()  # its Redis stopped with it


def test_unpin_lets_the_next_load_read_the_store(clean_redis):
    from gpu_worker.store import ManifestPins

    ManifestPins(clean_redis).pin("demo-3", '{"format_version": 1, "shards": []}')
    assert "unpinned" in ok("unpin", "demo-3")
    assert ManifestPins(clean_redis).get("demo-3") is None
    assert "was not pinned" in ok("unpin", "demo-3")


def test_publish_puts_a_saved_folder_in_the_store(tmp_path):
    saved = tmp_path / "saved"
    (saved / "unet").mkdir(parents=True)
    (saved / "model_index.json").write_text("{}")
    (saved / "unet" / "config.json").write_text('{"layers": 2}')
    store = tmp_path / "store"
    out = ok("publish", str(saved), "my-pipe", "--store", f"file://{store}")
    assert "my-pipe: 2 files" in out
    manifest = json.loads((store / "my-pipe" / "manifest.json").read_text())
    assert [s["file"] for s in manifest["shards"]] == ["model_index.json", "unet/config.json"]
    assert (store / "my-pipe" / "unet" / "config.json").read_text() == '{"layers": 2}'
    assert "no store" in failed("publish", str(saved), "my-pipe")
