"""A Redis that may evict keys is refused at start: by workers, beat and `lanes up`.

Each test runs a Redis of its own (the session's stays ``noeviction``), set to an
evicting policy with ``CONFIG SET``, or with ``CONFIG`` renamed away as managed Redis
services do, where the policy is read from ``INFO memory``.
"""
from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from gpu_worker.launcher import EXIT_CONFIG, worker_command
from gpu_worker.redis_server import EmbeddedRedis
from tasks.broker.eviction import check_no_eviction, eviction_policy
from tasks.errors import ConfigError

EVICTING = ("allkeys-lru", "volatile-lru")


@pytest.fixture
def own_redis():
    """Start Redis servers of this test's own (``extra_args`` for each); all stop after."""
    started: list[EmbeddedRedis] = []

    def start(*extra_args: str) -> EmbeddedRedis:
        data_dir = Path(tempfile.mkdtemp(prefix="gl-ev-", dir="/tmp"))  # a short socket path
        started.append(EmbeddedRedis(data_dir, extra_args=extra_args).start())
        return started[-1]

    yield start
    for server in started:
        server.stop()
        shutil.rmtree(server.data_dir, ignore_errors=True)


def test_the_embedded_redis_never_evicts(own_redis):
    server = own_redis()
    args = server.process.args  # said on its command line, not left to a default
    assert args[args.index("--maxmemory-policy") + 1] == "noeviction"
    assert server.client().config_get("maxmemory-policy") == {"maxmemory-policy": "noeviction"}
    check_no_eviction(server.client())


@pytest.mark.parametrize("policy", EVICTING)
def test_an_evicting_policy_is_a_config_error_naming_the_setting(own_redis, policy):
    client = own_redis().client()
    client.config_set("maxmemory-policy", policy)
    with pytest.raises(ConfigError, match="maxmemory-policy noeviction") as refused:
        check_no_eviction(client)
    assert refused.value.variable == "maxmemory-policy" and policy in str(refused.value)


def test_without_config_the_policy_is_read_from_info_memory(own_redis):
    """Managed Redis disables CONFIG: the check reads INFO memory instead."""
    client = own_redis("--rename-command", "CONFIG", "", "--maxmemory-policy",
                       "volatile-ttl").client()
    with pytest.raises(Exception, match="unknown command"):
        client.config_get("maxmemory-policy")
    assert eviction_policy(client) == "volatile-ttl"
    with pytest.raises(ConfigError, match="volatile-ttl"):
        check_no_eviction(client)


def _env(server: EmbeddedRedis, broker: bool = True) -> dict[str, str]:
    env = {**os.environ, "GPULANES_STATE_DIR": str(server.data_dir),
           "GPULANES_BROKER_URL": server.url}
    if not broker:  # `lanes up` runs (here: finds) the embedded Redis of its state folder
        del env["GPULANES_BROKER_URL"]
    return env


def _start(name: str, args: list[str], env: dict[str, str], log_dir: Path) -> subprocess.Popen:
    with open(log_dir / f"{name}.log", "wb") as log:  # the child keeps its own copy
        return subprocess.Popen(args, env=env, stdout=log, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL, start_new_session=True)


@pytest.fixture
def processes():
    """Processes of this test by name; any still running after it is killed, its session
    too (what `lanes up` started gets SIGTERM as it dies)."""
    started: dict[str, subprocess.Popen] = {}
    yield started
    for proc in started.values():
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


def _exits(procs: dict[str, subprocess.Popen], timeout_s: float = 60) -> dict[str, int | None]:
    """Each process' exit code within one shared ``timeout_s``; None: still running."""
    deadline = time.monotonic() + timeout_s
    codes: dict[str, int | None] = {}
    for name, proc in procs.items():
        try:
            codes[name] = proc.wait(max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            codes[name] = None
    return codes


def test_workers_beat_and_lanes_up_refuse_an_evicting_redis(own_redis, processes, tmp_path):
    """Real processes, started together: a worker on each evicting policy exits with
    EX_CONFIG before consuming anything, beat too, and `lanes up` starts nothing."""
    servers = {policy: own_redis() for policy in EVICTING}
    for policy, server in servers.items():
        server.client().config_set("maxmemory-policy", policy)
        server.client().lpush("fast", b"not taken")  # a worker that consumed would take it
    lru = servers["allkeys-lru"]
    procs = processes
    for policy, server in servers.items():
        procs[f"worker-{policy}"] = _start(f"worker-{policy}", worker_command(0, 1, "INFO"),
                                           _env(server), tmp_path)
    procs["beat"] = _start("beat", [sys.executable, "-m", "celery", "-A", "tasks", "beat",
                                    "--loglevel", "INFO"], _env(lru), tmp_path)
    procs["up"] = _start("up", [sys.executable, "-m", "celery", "-A", "tasks", "lanes", "up",
                                "--workers", "1"], _env(lru, broker=False), tmp_path)
    codes = _exits(procs)
    logs = {name: (tmp_path / f"{name}.log").read_text() for name in procs}
    assert codes == {"worker-allkeys-lru": EXIT_CONFIG, "worker-volatile-lru": EXIT_CONFIG,
                     "beat": EXIT_CONFIG, "up": 1}, logs
    for name, log in logs.items():
        assert "maxmemory-policy noeviction" in log, (name, log)
        assert name == "up" or "ConfigError: maxmemory-policy" in log, (name, log)
    for server in servers.values():
        assert server.client().lrange("fast", 0, -1) == [b"not taken"]
    assert not list(lru.data_dir.glob("workers.log"))  # `up` started no worker
