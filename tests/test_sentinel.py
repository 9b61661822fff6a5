"""A broker behind Redis Sentinel: a real Redis, a real Sentinel watching it."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import redis
from conftest import free_port, wait_until

from gpu_worker.processes import spawn
from gpu_worker.redis_server import EmbeddedRedis, redis_binary
from tasks.broker.keys import lane_keys
from tasks.broker.store import FollowingConnection, connect

PROJECT_DIR = Path(__file__).resolve().parent.parent


@pytest.fixture()
def sentinel(tmp_path):
    """(sentinel URL, the Redis it watches as master "gl")."""
    server = EmbeddedRedis(tmp_path / "redis", port=free_port()).start()
    port = free_port()
    conf = tmp_path / "sentinel.conf"
    conf.write_text(f"port {port}\nbind 127.0.0.1\ndir {tmp_path}\n"
                    f"sentinel monitor gl 127.0.0.1 {server.port} 1\n")
    proc = spawn([redis_binary(), str(conf), "--sentinel"], stdout=subprocess.DEVNULL,
                 stderr=subprocess.DEVNULL)
    url = f"sentinel://127.0.0.1:{port}"
    try:
        wait_until(lambda: _answers(url), timeout_s=20, what="Sentinel to name the master")
        yield url, server
    finally:
        os.kill(server.process.pid, signal.SIGCONT)
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
        server.stop()


def _answers(url: str) -> bool:
    try:
        return bool(connect(url, "gl", socket_timeout=1).ping())
    except Exception:  # noqa: BLE001  not up yet
        return False


def _run(code: str, **env: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", code], cwd=PROJECT_DIR, text=True,
                          capture_output=True, timeout=60, env={**os.environ, **env})


def test_submit_and_our_own_clients_reach_the_master_through_sentinel(sentinel):
    url, server = sentinel
    client = connect(url, "gl")
    client.set("gpulanes:probe", "1")
    assert server.client().get("gpulanes:probe") == b"1"  # the master Sentinel named
    proc = _run("from tasks import submit\n"
                "from tasks.broker.app import redis_client\n"
                "assert redis_client().ping()\n"
                "print(submit('through sentinel', tier='fast', seed=1).id)",
                GPULANES_BROKER_URL=url, GPULANES_SENTINEL_MASTER="gl")
    assert proc.returncode == 0, proc.stderr
    # kombu published on the master's fast lane
    assert sum(server.client().llen(key) for key in lane_keys("fast")) == 1


def test_a_sentinel_url_without_the_master_name_is_a_config_error():
    proc = _run("import celeryconfig", GPULANES_BROKER_URL="sentinel://127.0.0.1:26379",
                GPULANES_SENTINEL_MASTER="")
    assert proc.returncode != 0 and "GPULANES_SENTINEL_MASTER" in proc.stderr


def test_a_demoted_master_sends_its_clients_back_to_the_sentinels(sentinel):
    """A write refused READONLY by the master a client holds (a failover demoted it)
    drops that connection, so the next asks the Sentinels again: a refusal keeps
    redis-py's ``ReadOnlyError`` (gpulanes' parser makes it an outage as well)."""
    import redis

    url, server = sentinel
    client = connect(url, "gl")
    client.set("gpulanes:probe", "1")
    held = client.connection_pool.get_connection()
    client.connection_pool.release(held)
    server.client().execute_command("REPLICAOF", "127.0.0.1", "1")  # demoted by hand
    try:
        with pytest.raises(redis.exceptions.ConnectionError,
                           match="previous master is now a slave"):
            client.set("gpulanes:probe", "2")
        assert not held.is_connected  # dropped: the next connect asks the Sentinels
    finally:
        server.client().execute_command("REPLICAOF", "NO", "ONE")


def test_a_reply_that_timed_out_never_answers_the_next_command(sentinel):
    """redis-py leaves a Sentinel connection open after a read timeout; the late reply
    would then answer the next command on it (a frozen primary that wakes up)."""
    url, server = sentinel
    client = connect(url, "gl", timeout_s=0.5)
    assert isinstance(client.connection_pool.get_connection(), FollowingConnection)
    client.mset({"first": "1", "second": "2"})
    os.kill(server.process.pid, signal.SIGSTOP)
    with pytest.raises(redis.exceptions.TimeoutError):
        client.get("first")
    os.kill(server.process.pid, signal.SIGCONT)
    time.sleep(0.2)  # the reply to the first GET is on its way, if its socket stayed open
    assert client.get("second") == "2"
