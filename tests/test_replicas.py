"""Writes a replica must confirm (``GPULANES_REDIS_REPLICAS``), on a real primary and
replica; every Sentinel client closing a connection whose reply it did not read; a
beat whose lease renewals fail for any reason stops leading."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import free_port, wait_until

from gpu_worker.redis_server import EmbeddedRedis
from tasks.broker import scripts
from tasks.broker.keys import BEAT_EPOCH_KEY, BEAT_LEADER_KEY, done_key, lane_keys
from tasks.broker.outage import RedisRefused
from tasks.broker.store import connect

PROJECT_DIR = Path(__file__).resolve().parent.parent


@pytest.fixture()
def pair(tmp_path):
    """(primary, replica): two embedded Redis servers, the second replicating the first."""
    primary = EmbeddedRedis(tmp_path / "a", port=free_port()).start()
    replica = EmbeddedRedis(tmp_path / "b", port=free_port(), extra_args=[
        "--replicaof", "127.0.0.1", str(primary.port)]).start()
    try:
        wait_until(lambda: primary.client().info("replication")["connected_slaves"] == 1,
                   what="the replica to sync")
        yield primary, replica
    finally:
        # throwaway servers: killed (a clean shutdown of the pair could wait out the
        # stop's 10 s timeout)
        os.kill(replica.process.pid, signal.SIGCONT)
        replica.kill()
        primary.kill()


def _lead(client, identity: str, replicas: int = 1):
    return scripts.replicated(client, "lead", [BEAT_LEADER_KEY, BEAT_EPOCH_KEY],
                              [identity, 5000, 0], replicas, 0.5)


def test_a_replicated_write_returns_once_the_replica_holds_it(pair):
    primary, replica = pair
    client = connect(f"redis://127.0.0.1:{primary.port}")
    assert [int(x) for x in _lead(client, "beat-a")] == [1, 1]
    assert replica.client().get(BEAT_EPOCH_KEY) == b"1"  # there when the call returned


def test_a_write_no_replica_confirms_is_refused_and_so_is_its_retry(pair):
    """A retry that finds its work done writes nothing itself: the write that follows
    it makes its WAIT cover what the first call wrote."""
    primary, replica = pair
    client = connect(f"redis://127.0.0.1:{primary.port}")
    os.kill(replica.process.pid, signal.SIGSTOP)
    began = time.monotonic()
    with pytest.raises(scripts.NotReplicated, match="0 of the 1 replicas") as refused:
        _lead(client, "beat-a")
    assert refused.value.code == "NOREPLICAS" and isinstance(refused.value, RedisRefused)
    assert time.monotonic() - began < 3.0
    # a job done on the primary only (another client wrote it): its run's begin answers
    # 'done' without a write, and still waits for the replica
    other = connect(f"redis://127.0.0.1:{primary.port}")
    other.set(done_key("j1"), "{}")
    with pytest.raises(scripts.NotReplicated):
        scripts.replicated(client, "run_begin", [done_key("j1"), "l", "c", "r", "d", "h"],
                           ["holder", 10, 10, "j1", "tag", "", "released:", "", 10], 1, 0.5)
    os.kill(replica.process.pid, signal.SIGCONT)
    assert scripts.replicated(client, "run_begin", [done_key("j1"), "l", "c", "r", "d", "h"],
                              ["holder", 10, 10, "j1", "tag", "", "released:", "", 10],
                              1, 2.0)[0] == "done"


def _run(code: str, **env: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", code], cwd=PROJECT_DIR, text=True,
                          capture_output=True, timeout=60,
                          env={**os.environ, **{f"GPULANES_{k}": v for k, v in env.items()}})


def test_submit_counts_a_job_accepted_once_a_replica_holds_it(pair):
    primary, replica = pair
    url = f"redis://127.0.0.1:{primary.port}"
    code = ("from tasks import submit\n"
            "from tasks.errors import BrokerRefused\n"
            "try:\n    print('accepted', submit('replicated', seed=1).id)\n"
            "except BrokerRefused as exc:\n    print('refused', exc.code, exc)\n")
    done = _run(code, BROKER_URL=url, REDIS_REPLICAS="1")
    assert done.stdout.startswith("accepted"), done.stderr
    job_id = done.stdout.split()[1]
    assert any(job_id.encode() in raw for key in lane_keys("standard")
               for raw in replica.client().lrange(key, 0, -1))
    os.kill(replica.process.pid, signal.SIGSTOP)
    # a write waits a third of the Redis timeout for its replica: 0.5 s
    refused = _run(code, BROKER_URL=url, REDIS_REPLICAS="1", REDIS_TIMEOUT_S="1.5")
    assert refused.stdout.startswith("refused NOREPLICAS"), refused.stderr
    assert "not accepted" in refused.stdout and "GPULANES_REDIS_REPLICAS" in refused.stdout


def test_every_client_of_a_sentinel_url_closes_a_connection_after_a_timeout():
    """gpulanes' transport and Celery's result backend build their own connections."""
    code = ("from tasks.broker.app import app\n"
            "from tasks.broker.store import FollowingConnection\n"
            "pool = app.connection_for_write().transport.commands.connection_pool\n"
            "assert issubclass(pool.connection_class, FollowingConnection)\n"
            "assert app.backend.connparams['connection_class'] is FollowingConnection\n"
            "print('ok')\n")
    proc = _run(code, BROKER_URL="sentinel://127.0.0.1:1", SENTINEL_MASTER="gl")
    assert proc.stdout.strip() == "ok", proc.stderr


def test_a_beat_whose_renewals_fail_for_any_reason_stops_leading(redis_server):
    from beat.lease import Leadership

    now = [100.0]
    leadership = Leadership(lease_s=2.0, clock=lambda: now[0])
    assert leadership.renew() and leadership.current() == leadership.epoch
    leadership.client = object()  # a reply no lead can be read from: not a Redis error
    with pytest.raises(Exception):
        leadership.renew()
    now[0] += 1.0
    assert leadership.current() == leadership.epoch  # within its lease
    now[0] += 1.5
    assert leadership.current() == 0  # renewed 2.5 s ago: a standby may lead by now


def test_the_renewal_thread_outlives_an_error_that_is_not_redis():
    from beat.lease import Leadership

    leadership, calls = Leadership(lease_s=0.04), []

    def failing() -> int:
        calls.append(1)
        if len(calls) == 3:
            leadership._stop.set()
        raise TypeError("int() argument must be ... not 'list'")  # a reply misread

    leadership.renew = failing
    leadership._loop()  # returns once stopped, having tried three times
    assert len(calls) == 3
