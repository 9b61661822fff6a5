"""A real cluster: one CPU worker process, beat, and the session Redis."""
from __future__ import annotations

import json
import time
from pathlib import Path

import numpy as np
import pytest
from conftest import SMALL, new_gate, vary, wait_at_gate, wait_until
from PIL import Image

from routing.names import STATS_COMMAND
from tasks import submit
from tasks.broker.keys import SNAPSHOT_KEY, WORKERS_KEY
from tasks.errors import JobFailed
from tests.flaky_model import open_gate

pytestmark = pytest.mark.cluster


@pytest.fixture(scope="module")
def cluster(cluster_factory):
    return cluster_factory(workers=1, beat=True)


def test_result_dict_and_png(cluster):
    out = submit("a red fox in snow", tier="fast", seed=3, **SMALL).get(timeout=60)
    for key in ("image", "lane", "requested_tier", "worker", "device", "queued_ms",
                "run_ms", "attempts", "cached"):
        assert key in out, key
    assert out["lane"] == out["requested_tier"] == "fast"
    assert out["worker"] == cluster.hostnames[0] and out["device"] == "cpu"
    assert out["attempts"] == 1 and out["cached"] is False and out["cold_start"] is False
    assert out["batch_size"] == 1 and out["batch_wait_ms"] == 0  # batching is off by default
    assert out["queued_ms"] >= 0 and out["run_ms"] > 0
    image = Image.open(out["image"])
    assert image.format == "PNG" and image.size == (64, 64) and image.mode == "RGB"
    assert Path(out["image"]).name == f"{out['job_id']}-1.png"  # run 1's own file


def test_fast_job_overtakes_relaxed_backlog_on_one_worker(cluster):
    gate = new_gate()
    blocker = submit(f"gate:{gate} hold the worker", tier="relaxed", model="flaky", **SMALL)
    wait_at_gate(blocker, gate)
    backlog = [submit(f"backlog {i}", tier="relaxed", seed=i, **SMALL) for i in range(15)]
    fast = submit("urgent", tier="fast", seed=99, **SMALL)
    open_gate(gate)
    done_fast = fast.get(timeout=60)
    done_backlog = [r.get(timeout=120) for r in backlog]
    blocker.get(timeout=60)
    # With one job in hand per worker, the fast job is next after the blocker.
    assert done_fast["started_at"] < min(r["started_at"] for r in done_backlog)
    # ...while the backlog keeps its FIFO order among itself.
    starts = [r["started_at"] for r in done_backlog]
    assert starts == sorted(starts)


def test_same_seed_same_png_different_seed_different(cluster, monkeypatch):
    vary(monkeypatch, cache=False)  # two real runs, not one run shared by both
    a, b, c = (submit("tidal pools at dusk", seed=s, **SMALL) for s in (5, 5, 6))
    paths = [r.get(timeout=60)["image"] for r in (a, b, c)]
    assert paths[0] != paths[1]  # each job writes its own file...
    assert Path(paths[0]).read_bytes() == Path(paths[1]).read_bytes()  # ...bit-identical
    pixels = [np.asarray(Image.open(p)) for p in paths]
    assert not np.array_equal(pixels[0], pixels[2])


def test_transient_failure_retries_with_backoff_then_succeeds(cluster):
    began = time.time()
    out = submit("transient:2 flaky gpu", model="flaky", seed=1, **SMALL).get(timeout=60)
    assert out["attempts"] == 3
    assert out["started_at"] - began < 10  # two backoffs of 0.5 s and 1 s, plus jitter


def test_transient_failure_gives_up_after_three_retries(cluster):
    result = submit("transient:always broken gpu", model="flaky", seed=2, **SMALL)
    with pytest.raises(JobFailed, match="gave up after 4 attempts"):
        result.get(timeout=60)


def test_out_of_memory_is_retried_and_never_kills_the_worker(cluster):
    from tasks import app

    def pids() -> dict[str, int]:
        answers = app.control.broadcast(STATS_COMMAND, reply=True, timeout=1.0)
        return {host: reply["pid"] for answer in answers for host, reply in answer.items()}

    before = pids()
    out = submit("oom:2 too big for the card", model="flaky", seed=4, **SMALL).get(timeout=60)
    assert out["attempts"] == 3 and out["image"]
    assert pids() == before and len(before) == 1  # the same worker process, alive


def test_a_worker_keeps_the_memory_a_job_frees_for_the_next_one(cluster):
    """glibc's default would map each big buffer afresh and fault it in page by page,
    every job (``gpu_worker.launcher.MALLOC_ENV``)."""
    from tasks import app

    answers = app.control.broadcast(STATS_COMMAND, reply=True, timeout=1.0)
    pid = next(reply["pid"] for answer in answers for reply in answer.values())

    def page_faults() -> int:  # minor faults of the worker process (Linux /proc)
        return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[7])

    size = dict(steps=4, width=128, height=128)
    for seed in range(3):
        submit("warm", tier="fast", seed=seed, **size).get(timeout=60)
    before = page_faults()
    for seed in range(3, 11):
        submit("a lighthouse", tier="fast", seed=seed, **size).get(timeout=60)
    per_job = (page_faults() - before) / 8
    assert per_job < 200, per_job  # glibc's default here: about 600 a job


def test_bug_fails_at_once_with_a_clear_error(cluster):
    result = submit("bug in the weights", model="flaky", seed=3, **SMALL)
    with pytest.raises(JobFailed, match="attempt 1: ValueError: simulated bug"):
        result.get(timeout=60)


def test_heartbeat_records_liveness_and_load(cluster, clean_redis):
    submit("warm it", seed=1, **SMALL).get(timeout=60)
    host = cluster.hostnames[0]

    def settled_snapshot():  # a snapshot with the job counted and nothing running
        snapshot = json.loads(clean_redis.get(SNAPSHOT_KEY) or "{}")
        info = json.loads(clean_redis.hget(WORKERS_KEY, host) or "{}")
        settled = info.get("alive") and info["missed"] == 0 and "standard" in info["service_ms"]
        return (snapshot, info) if settled and not sum(info["in_flight"].values()) else None

    snapshot, info = wait_until(settled_snapshot, timeout_s=20,
                                what=f"a settled heartbeat of {host}")
    assert info["device"] == "cpu" and info["service_ms"]["standard"] > 0
    base_ms, unit_ms = info["cost_ms"]["demo"]  # its demo jobs' line: ms = base + unit x cost
    assert base_ms >= 0 and unit_ms >= 0 and base_ms + unit_ms > 0  # (flat when, on a busy
    # machine, the module's bigger jobs ran no slower: gpu_worker.costfit)
    assert "demo" in info["warm_models"]
    assert info["lanes"] == ["fast", "standard", "relaxed"]
    stored = {h.decode(): json.loads(v) for h, v in clean_redis.hgetall(WORKERS_KEY).items()}
    assert host in stored  # the worker record beat keeps beside the snapshot
    assert "workers" not in snapshot and snapshot["members"]  # routers read a compact one
    assert set(snapshot["lanes"]) == {"fast", "standard", "relaxed"}
    standard = snapshot["lanes"]["standard"]
    assert standard["workers"] == 1 and standard["depth"] == 0 and standard["service_s"] > 0


def test_a_worker_counts_its_time_between_queued_jobs_in_their_service(cluster, clean_redis):
    host, gate = cluster.hostnames[0], new_gate()
    blocker = submit(f"gate:{gate} hold", model="flaky", tier="fast", **SMALL)
    wait_at_gate(blocker, gate)
    queued = [submit(f"queued {i}", tier="relaxed", seed=i, **SMALL) for i in range(8)]
    open_gate(gate)
    for result in queued:  # each waited for the slot
        result.get(timeout=60)

    def measured():
        info = json.loads(clean_redis.hget(WORKERS_KEY, host) or "{}")
        idle = info.get("served") and not sum(info.get("in_flight", {}).values())
        return info if idle and info.get("between_ms", 0) > 0 else None

    info = wait_until(measured, timeout_s=20, what=f"{host}'s time between jobs")
    # the ack, the next fetch and the task's set-up: real time, far less than a second
    assert 0 < info["between_ms"] < 1000
