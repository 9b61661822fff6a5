"""Faults on a real cluster, each counted: jobs submitted, accepted, completed,
re-run, duplicated and lost (lost must be 0). The soak ``tests/soak/faults.py`` runs
the same faults for minutes; this is the quick form."""
from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import SMALL, new_gate, wait_at_gate, wait_until

import tasks.broker.enqueue as enqueue
from routing.names import JOB_TASK
from tasks import submit
from tasks.broker.keys import attempts_key
from tasks.settings import settings
from tests.flaky_model import open_gate
from tests.harness.faults import (
    HEADERS,
    JobStream,
    kill_supervisor,
    settle,
    wait_replaced,
    worker_pids,
)
from tests.harness.tables import markdown_table

pytestmark = pytest.mark.cluster
#: Seconds a gated job is held: several of its lease's lives (3 s here).
HELD_S = 11
ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def cluster(cluster_factory):
    return cluster_factory(workers=2, beat=True)


def _report(counts) -> None:
    print("\n" + markdown_table(HEADERS, [counts.row()]))


def _received(cluster, job_id: str) -> int:
    """How many times a worker of ``cluster`` received job ``job_id``'s message."""
    log = (cluster.log_dir / "workers.log").read_text(errors="replace")
    return log.count(f"{JOB_TASK}[{job_id}] received")


def _runs(client, results) -> list[int]:
    return [int(client.get(attempts_key(r.id)) or 0) for r in results]


def _all_new(pids: dict[str, int], old: dict[str, int]) -> bool:
    """Every worker of ``old`` answers, each from a new process."""
    return set(pids) == set(old) and not set(pids.values()) & set(old.values())


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def test_workers_sigkilled_mid_job_during_a_stream_lose_nothing(cluster, app, clean_redis):
    """Each kill lands while the worker runs a job (held at a gate): its record names the
    job, and beat gives it back."""
    stream, doomed = JobStream().start(rate_per_s=15), []
    for _ in range(2):
        gate = new_gate()
        doomed.append(submit(f"gate:{gate} killed mid-job", model="flaky", tier="fast", **SMALL))
        wait_at_gate(doomed[-1], gate)
        victim = doomed[-1].info  # STARTED meta: the worker's hostname and pid
        os.kill(victim["pid"], signal.SIGKILL)
        open_gate(gate)
        assert wait_replaced(app, victim["hostname"], victim["pid"]), "not restarted"
    stream.stop()
    stream.accepted.update((r.id, r) for r in doomed)
    counts = settle(stream, "worker SIGKILL mid-job x2", clean_redis, timeout_s=60)
    _report(counts)
    assert counts.refused == 0 and counts.accepted == counts.submitted + 2 > 20
    assert counts.lost == 0, counts.lost_ids
    assert counts.completed == counts.accepted and counts.duplicated == 0
    assert [r.get(timeout=5)["attempts"] for r in doomed] == [2, 2]  # killed run, then one more


def test_a_long_job_is_never_handed_out_again(cluster, app, clean_redis):
    """Nothing hands a job out again on a timer: a job held far past its lease's life
    (its worker keeps extending it) is delivered once and runs once."""
    gate = new_gate()
    long_job = submit(f"gate:{gate} held a long time", model="flaky", **SMALL)
    wait_at_gate(long_job, gate)
    stream = JobStream().start(rate_per_s=10)  # the other worker stays free to take a copy
    # Hold it, watching for a second delivery all the while.
    held_until = time.monotonic() + HELD_S
    wait_until(lambda: time.monotonic() > held_until or _received(cluster, long_job.id) > 1,
               timeout_s=30, what="the hold to end")
    assert _received(cluster, long_job.id) == 1, "the broker delivered the running job again"
    open_gate(gate)
    stream.accepted[long_job.id] = long_job
    stream.stop()
    counts = settle(stream, f"job held {HELD_S}s, its lease {settings.lease_ttl_s}s",
                    clean_redis, timeout_s=60)
    _report(counts)
    assert long_job.get(timeout=5)["attempts"] == 1
    assert int(clean_redis.get(attempts_key(long_job.id))) == 1
    assert counts.lost == 0 and counts.duplicated == 0 and counts.rerun == 0


def test_supervisor_killed_and_restarted_while_workers_hold_jobs(cluster, app, clean_redis,
                                                                monkeypatch):
    monkeypatch.setattr(enqueue, "ROUTE_HASHING", False)  # shared lanes: each takes one
    gates = [new_gate(), new_gate()]
    held = [submit(f"gate:{g} held over a supervisor crash", model="flaky", **SMALL)
            for g in gates]
    for result, gate in zip(held, gates):
        wait_at_gate(result, gate)
    old = worker_pids(app, 2)
    stream = JobStream().start(rate_per_s=20)
    stream.wait_for(20, timeout_s=30)
    kill_supervisor(cluster)  # its workers get SIGTERM: they hand on the jobs they hold
    cluster.start_workers()
    # Keep the jobs held until the new workers consume, beside the old ones that
    # finish them (silent to heartbeats), and beat has judged a few more rounds:
    # no second process may run them meanwhile.
    wait_until(lambda: _all_new(worker_pids(app, 2, timeout_s=0), old), timeout_s=60,
               what="the new workers to answer")
    window_ends = time.monotonic() + 3 * settings.heartbeat_s
    wait_until(lambda: time.monotonic() > window_ends or _runs(clean_redis, held) != [1, 1],
               timeout_s=30, what="the window to pass")
    assert _runs(clean_redis, held) == [1, 1], "a held job started again elsewhere"
    for gate in gates:
        open_gate(gate)
    stream.wait_for(stream.submitted + 20, timeout_s=30)
    stream.stop()
    for result in held:
        stream.accepted[result.id] = result
    counts = settle(stream, "supervisor SIGKILL + restart", clean_redis, timeout_s=90)
    _report(counts)
    assert _all_new(worker_pids(app, 2), old)
    wait_until(lambda: not [pid for pid in old.values() if _alive(pid)], timeout_s=30,
               what="the old workers to exit once their jobs were handed on")
    # each held job stepped aside at its first step past the gate and ran again once,
    # on a new worker (the flaky model does not resume): two runs, one end
    assert _runs(clean_redis, held) == [2, 2]
    assert all(r.get(timeout=5)["preempted"] == 1 for r in held)
    assert counts.lost == 0, counts.lost_ids
    assert counts.duplicated == 0 and counts.completed == counts.accepted


@pytest.fixture(scope="module")
def redis_faults(tmp_path_factory) -> dict[str, dict]:
    """tests/soak/faults.py --quick, its two Redis scenarios, on a cluster and Redis
    of its own (the default timeouts): their counts, by scenario."""
    out = tmp_path_factory.mktemp("soak") / "counts.json"
    proc = subprocess.run(
        [sys.executable, str(ROOT / "tests" / "soak" / "faults.py"), "--quick",
         "--only", "redis", "--only", "redis-freeze", "--json", str(out)],
        capture_output=True, text=True, timeout=170, cwd=ROOT,
        env={**os.environ, "GPULANES_KEEP_STATE": "1"})
    print(proc.stdout[-3000:], proc.stderr[-3000:])
    state = Path(proc.stdout.split("state folder: ", 1)[1].split()[0])
    if proc.returncode:  # what the cluster logged, for whoever reads this failure
        for log in ("workers.log", "beat.log"):
            print(f"--- {log} ---", (state / log).read_text(errors="replace")[-6000:])
    else:
        shutil.rmtree(state, ignore_errors=True)
    assert proc.returncode == 0
    rows = json.loads(out.read_text())
    for counts in rows:
        assert counts["accepted"] > 0
        assert counts["accepted"] + counts["refused"] == counts["submitted"]
        assert counts["lost"] == 0, counts["lost_ids"]
        assert counts["falsely_failed"] == 0 and counts["failed"] == 0
        assert counts["completed"] == counts["accepted"] and counts["duplicated"] == 0
    return {"redis": rows[0], "redis-freeze": rows[1]}


def test_redis_killed_and_restarted_from_its_aof(redis_faults):
    """The cluster's own Redis (not the session's) is SIGKILLed while jobs run and
    restarted from its AOF; a separate submitting process keeps submitting. The jobs
    running at the kill finish within seconds of the restart (their workers take the
    lapsed lease again)."""
    counts = redis_faults["redis"]
    assert counts["running_done_after_s"] < 30


def test_redis_frozen_refuses_submits_in_time_and_fails_nothing(redis_faults):
    """Redis SIGSTOPped 8 s (Finding 3): every submit meanwhile raises BrokerUnavailable
    within about GPULANES_REDIS_TIMEOUT_S and leaves nothing behind (a refused seeded
    job runs when submitted again); jobs finishing meanwhile are not reported failed."""
    counts = redis_faults["redis-freeze"]
    assert counts["refused"] > 0 and set(counts["refusals"]) == {"BrokerUnavailable"}
    assert counts["slowest_refusal_s"] < settings.redis_timeout_s + 2
    probe = counts["probe"]  # a seeded fast job: a cache claim and a fast place
    assert probe["refused"] == "BrokerUnavailable"
    assert probe["refusal_s"] < settings.redis_timeout_s + 2
    assert probe["done_after"]
