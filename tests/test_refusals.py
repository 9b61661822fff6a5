"""Redis that answers with a refusal (out of memory, its disk failing, a permission it
denies) on real workers, with the default timeouts, every job counted: nothing
wedges, nothing runs twice to the end, submits meanwhile get a typed error saying
what Redis said. The soak ``tests/soak/refusals.py`` runs the longer blips."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pytest
import redis
from conftest import SMALL, new_gate, wait_at_gate, wait_until

from gpu_worker.stuck import STUCK_HEARTBEATS
from tasks import submit
from tasks.broker.keys import WORKERS_KEY
from tasks.broker.outage import OUTAGE, RedisRefused, refused
from tasks.errors import BrokerRefused, BrokerUnavailable
from tasks.settings import settings
from tests.flaky_model import open_gate, runs_finished, runs_started
from tests.harness.refusals import disk_failing, out_of_memory, refusal_blip

pytestmark = pytest.mark.cluster
#: A stuck worker exits this soon.
STUCK_EXIT_S = STUCK_HEARTBEATS * settings.heartbeat_s


@pytest.fixture(scope="module")
def cluster(cluster_factory):
    # five jobs in hand per worker, run as one batch: ten jobs in flight on two workers
    return cluster_factory(workers=2, beat=True, env={
        "GPULANES_MAX_BATCH": "flaky=5", "GPULANES_MAX_QUEUE_DELAY_MS": "flaky=500",
        "GPULANES_WARM_MODELS": "flaky"})


def _records(client) -> dict[str, dict]:
    return {h.decode(): json.loads(w) for h, w in client.hgetall(WORKERS_KEY).items()}


def _incarnations(client) -> set[str]:
    return {w["incarnation"] for w in _records(client).values() if w.get("alive")}


def _both_workers(client) -> set[str]:
    """The two workers' processes, once beat has heard from both."""
    return wait_until(lambda: found if len(found := _incarnations(client)) == 2 else None,
                      30, "beat to hear from both workers")


def test_refusals_are_typed_and_say_what_redis_said(redis_server, clean_redis):
    """A refused write is an outage (a ``ConnectionError``) that names the refusal, on
    a plain command, a script and a transaction; ``submit()`` raises ``BrokerRefused``
    (a ``BrokerUnavailable``) saying what Redis said, not "did not answer"."""
    from tasks.broker.app import redis_client

    client = redis_client()
    for fault, code, words in ((out_of_memory, "OOM", "out of memory"),
                               (disk_failing, "MISCONF", "disk")):
        with fault(clean_redis):
            for write in (lambda: client.set("k", "v"),
                          lambda: client.eval("return redis.call('SET', 'k', 'v')", 0),
                          lambda: client.pipeline().set("k", "v").incr("n").execute()):
                with pytest.raises(RedisRefused) as error:
                    write()
                assert error.value.code == code
                assert isinstance(error.value, redis.exceptions.ConnectionError)
            with pytest.raises(BrokerRefused) as caught:
                submit("refused", **SMALL)
            assert caught.value.code == code and words in str(caught.value)
            assert "did not answer" not in str(caught.value)
            assert client.get("k") is None  # reads still answer
        assert submit("accepted again", **SMALL).id


@pytest.mark.parametrize("fault,seconds", [("oom", 4), ("misconf", 8)])
def test_refusal_blip_with_ten_jobs_in_flight(cluster, clean_redis, fault, seconds):
    before = _both_workers(clean_redis)
    counts = refusal_blip(clean_redis, fault, seconds)
    print(counts)
    assert counts["done"] == counts["jobs"], counts  # every job, none failed or lost
    assert counts["failed"] == 0 and counts["lost"] == 0, counts
    assert counts["latest_s"] <= 10, counts  # done within 10 s of Redis taking writes
    assert counts["ran_twice"] == 0, counts
    code = {"oom": "OOM", "misconf": "MISCONF"}[fault]
    assert counts["refusals"] and set(counts["refusals"]) == {f"BrokerRefused({code})"}, counts
    assert f"({code}" in counts["status_shown"], counts  # `lanes status` says so meanwhile
    assert _incarnations(clean_redis) == before  # nobody exited (not stuck: an outage)


def test_submits_refused_near_maxmemory_keep_room_for_accepted_jobs(cluster, clean_redis):
    """Over ``MEMORY_LIMIT`` (0.9) of maxmemory, as beat measured it, a
    submit is refused with ``BrokerRefused`` before Redis itself refuses; a job already
    accepted still finishes."""
    from tasks.broker.view import snapshot_cache

    gate = new_gate()
    accepted = submit(f"gate:{gate} accepted before", model="flaky", tier="fast", **SMALL)
    wait_at_gate(accepted, gate)
    clean_redis.set("filler", b"x" * (8 << 20))  # Redis' own churn, small beside it

    def near_maxmemory() -> bool:
        """Beat has measured over 0.9 of maxmemory; else maxmemory is set again to 1/0.95
        of the use now (the filler's write counts twice in ``used_memory`` until Redis
        frees its query buffer)."""
        if (view := snapshot_cache().view()) and view.memory_share > 0.9:
            return True
        used = clean_redis.info("memory")["used_memory"]
        clean_redis.config_set("maxmemory", int(used / 0.95))
        return False
    try:
        wait_until(near_maxmemory, 30, "beat to measure Redis' memory")
        with pytest.raises(BrokerRefused, match="over the 90% limit"):
            submit("too near maxmemory", **SMALL)
        open_gate(gate)
        assert accepted.get(timeout=30)["lane"] == "fast"
    finally:
        clean_redis.config_set("maxmemory", 0)
    wait_until(lambda: snapshot_cache().view().memory_share == 0, 15, "the limit lifted")
    assert submit("room again", **SMALL).get(timeout=30)["attempts"] == 1


def test_a_wedged_worker_reports_stuck_then_exits_and_its_job_ends(cluster, clean_redis):
    """Redis denies Celery's own state write (an ACL without SETEX): the finished run
    never lets go of its job slot. Its worker shows ``stuck`` in ``lanes status --json``
    within a heartbeat, exits after ``STUCK_HEARTBEATS`` of them and is restarted; once
    the write is allowed again, the job ends, run once."""
    before = _both_workers(clean_redis)
    clean_redis.execute_command("ACL", "SETUSER", "default", "-setex")
    try:
        job = submit("bug stuck", model="flaky", tier="fast", seed=7, **SMALL)
        stuck = wait_until(lambda: [h for h, w in _records(clean_redis).items()
                                    if w.get("stuck") and job.id in w["stuck"]], 30,
                           "a worker to report itself stuck")
        shown = subprocess.run([sys.executable, "-m", "celery", "-A", "tasks", "lanes",
                                "status", "--json"], capture_output=True, text=True,
                               timeout=60, check=True).stdout
        assert job.id in json.loads(shown)["workers"][stuck[0]]["stuck"]
        wait_until(lambda: _incarnations(clean_redis) - before, STUCK_EXIT_S + 30,
                   "the stuck worker to exit and come back")
    finally:
        clean_redis.execute_command("ACL", "SETUSER", "default", "+setex")
    with pytest.raises(Exception, match="simulated bug"):
        job.get(timeout=60)
    assert job.state == "FAILURE"
    assert runs_started("bug stuck", 7) == 1


def test_sigterm_with_redis_frozen_stops_within_the_bound(cluster, app, clean_redis,
                                                          redis_server):
    """SIGTERM while Redis does not answer and a job runs: the workers stop within two
    Redis timeouts and a step; the job comes back through recovery and runs once."""
    from tasks.settings import settings

    job = submit("pace:100 sigterm", model="flaky", seed=3, steps=60, width=64, height=64)
    wait_until(lambda: job.state == "PROGRESS", 30, "the job to run")
    os.kill(redis_server.process.pid, signal.SIGSTOP)
    try:
        began = time.monotonic()
        code = cluster.stop_workers(timeout_s=60)
        stopped_s = time.monotonic() - began
    finally:
        os.kill(redis_server.process.pid, signal.SIGCONT)
    print(f"stopped in {stopped_s:.1f}s, status {code}")
    assert stopped_s <= 2 * settings.redis_timeout_s + 0.1 + 3  # a step, and process exits
    cluster.start_workers()
    cluster.wait_for_workers(app, cluster.hostnames, 120)
    assert job.get(timeout=90)["attempts"] == 2  # the stopped run, then one to the end
    assert runs_finished("pace:100 sigterm", 3) == 1


def test_a_demoted_or_busy_redis_refuses_as_an_outage(tmp_path):
    """READONLY (a replica: a primary that a failover demoted), from a command or a
    script, and BUSY (a script past its time limit) are outages too, each named."""
    import threading

    from gpu_worker.redis_server import EmbeddedRedis
    from tasks.broker.store import connect

    replica = EmbeddedRedis(tmp_path / "replica", extra_args=[
        "--replicaof", "127.0.0.1", "1", "--lua-time-limit", "50"]).start()
    try:
        client = connect(replica.url, timeout_s=5)
        for write in (lambda: client.set("k", "v"),
                      lambda: client.eval("return redis.call('SET', 'k', 'v')", 0)):
            with pytest.raises(OUTAGE) as caught:
                write()
            assert refused(caught.value).code == "READONLY"
            assert "read-only" in refused(caught.value).reason
        client.execute_command("REPLICAOF", "NO", "ONE")
        busy = threading.Thread(target=lambda: replica.client().eval(
            "local t = redis.call('TIME') "
            "while redis.call('TIME')[1] - t[1] < 2 do end return 1", 0))
        busy.start()

        def refusal() -> RedisRefused | None:
            try:
                client.set("k", "v")  # answered only once the script runs past its limit
            except RedisRefused as exc:
                return exc
            return None

        assert wait_until(refusal, 2, "a BUSY refusal").code == "BUSY"
        busy.join()
    finally:
        replica.kill()
