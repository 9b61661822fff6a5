"""A Redis that Sentinel fails over, on 127.0.0.1: a primary, two replicas, three Sentinels.

Each server is an :class:`~gpu_worker.redis_server.EmbeddedRedis` (AOF on,
``noeviction``) on a TCP port and in a folder of its own; each Sentinel runs from
its own ``sentinel.conf`` and log in its own folder. :class:`SentinelTopology`
starts them and waits until every Sentinel knows the replicas and the other
Sentinels, names the current primary, and reads a server's role and replication
offset without waiting on a frozen one. Two replicas: with
``GPULANES_REDIS_REPLICAS=1`` a failover leaves the new primary one replica to confirm
its writes (with one, it would refuse every write until the old primary came back). :class:`SentinelCluster` runs a gpulanes
cluster (``tasks.dev.cluster.LocalCluster``, more beats on demand) on it through the
``sentinel://`` URL. Like ``benchmarks.common``, nothing here imports ``tasks`` at
module level.
"""
from __future__ import annotations

import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Callable

import redis

from benchmarks.common import free_port

#: The master's name the Sentinels watch (``GPULANES_SENTINEL_MASTER``).
MASTER = "gl"


def quick_client(port: int, timeout_s: float = 0.3) -> redis.Redis:
    """A client of the server on ``port`` that gives up after ``timeout_s``, never
    retrying (a frozen server must not hold a watcher)."""
    return redis.Redis(port=port, socket_timeout=timeout_s, socket_connect_timeout=timeout_s,
                       retry_on_timeout=False, retry=None)


def wait_for(predicate: Callable[[], Any], timeout_s: float, what: str) -> Any:
    """Poll ``predicate`` until it returns something truthy; return that, or raise
    ``TimeoutError`` naming ``what``."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            value = predicate()
        except (redis.RedisError, OSError):
            value = None
        if value:
            return value
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out waiting for {what}")
        time.sleep(0.05)


class SentinelTopology:
    """A primary, ``replicas`` replicas and ``sentinels`` Sentinels (quorum 2) under
    ``root``."""

    def __init__(self, root: Path, *, down_after_ms: int = 3000,
                 failover_timeout_ms: int = 10000, sentinels: int = 3,
                 replicas: int = 2) -> None:
        from gpu_worker.redis_server import EmbeddedRedis

        self.root, self.down_after_ms = Path(root), down_after_ms
        self.failover_timeout_ms = failover_timeout_ms
        primary_port = free_port()
        self.servers = {primary_port: EmbeddedRedis(self.root / "redis-a", port=primary_port)}
        for index in range(replicas):
            port = free_port()
            self.servers[port] = EmbeddedRedis(
                self.root / f"redis-{'bcdefgh'[index]}", port=port,
                extra_args=["--replicaof", "127.0.0.1", str(primary_port)])
        self.replicas = replicas
        self.first_primary = primary_port
        self.sentinel_ports = [free_port() for _ in range(sentinels)]
        self.sentinels: list[subprocess.Popen] = []

    @property
    def url(self) -> str:
        """The broker URL: every Sentinel, ``;``-separated, as kombu takes it."""
        return ";".join(f"sentinel://127.0.0.1:{port}" for port in self.sentinel_ports)

    def server(self, port: int) -> Any:
        """The ``EmbeddedRedis`` listening on ``port``."""
        return self.servers[port]

    def others(self, port: int) -> list[int]:
        """The ports of the servers that are not on ``port``."""
        return [p for p in self.servers if p != port]

    def start(self, timeout_s: float = 30.0) -> "SentinelTopology":
        """Start both servers and the Sentinels; return once the replica is in sync
        and every Sentinel sees the primary, the replica and the other Sentinels."""
        for server in self.servers.values():
            server.start()
        wait_for(lambda: self.replica_offset(self.first_primary) is not None, timeout_s,
                 "the replicas to sync")
        for index, port in enumerate(self.sentinel_ports):
            self.sentinels.append(self._start_sentinel(index, port))
        wait_for(self._watched, timeout_s, "every Sentinel to see the whole topology")
        return self

    def _start_sentinel(self, index: int, port: int) -> subprocess.Popen:
        from gpu_worker.processes import spawn
        from gpu_worker.redis_server import redis_binary

        folder = self.root / f"sentinel-{index}"
        folder.mkdir(parents=True, exist_ok=True)
        conf = folder / "sentinel.conf"
        conf.write_text(
            f"port {port}\nbind 127.0.0.1\ndir {folder}\nlogfile {folder / 'sentinel.log'}\n"
            f"sentinel monitor {MASTER} 127.0.0.1 {self.first_primary} 2\n"
            f"sentinel down-after-milliseconds {MASTER} {self.down_after_ms}\n"
            f"sentinel failover-timeout {MASTER} {self.failover_timeout_ms}\n"
            f"sentinel parallel-syncs {MASTER} 1\n")
        return spawn([redis_binary(), str(conf), "--sentinel"], stdin=subprocess.DEVNULL,
                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)

    def _watched(self) -> bool:
        others = len(self.sentinel_ports) - 1
        for port in self.sentinel_ports:
            state = quick_client(port, 1.0).sentinel_master(MASTER)
            if state["num-slaves"] < self.replicas or state["num-other-sentinels"] < others:
                return False
        return True

    def master_port(self) -> int | None:
        """The primary's port as the first Sentinel that answers names it (None: none does)."""
        for port in self.sentinel_ports:
            try:
                _, master = quick_client(port).sentinel_get_master_addr_by_name(MASTER)
                return int(master)
            except (redis.RedisError, OSError, TypeError):
                continue
        return None

    def role(self, port: int) -> str | None:
        """``master`` or ``slave`` as the server on ``port`` says (None: it does not answer)."""
        try:
            return quick_client(port).info("replication")["role"]
        except (redis.RedisError, OSError):
            return None

    def replica_offset(self, primary: int) -> int | None:
        """The lowest replication offset the replicas acknowledged to the primary on
        ``primary`` (None: not every replica in sync, or the primary does not answer)."""
        try:
            info = quick_client(primary, 1.0).info("replication")
        except (redis.RedisError, OSError):
            return None
        found = [info.get(f"slave{i}") for i in range(self.replicas)]
        if not all(r and r["state"] == "online" for r in found):
            return None
        return min(int(r["offset"]) for r in found)

    def lag_bytes(self, primary: int) -> int:
        """How far (bytes of replication stream) the replicas' newest acknowledgement
        trails the primary on ``primary``."""
        info = quick_client(primary, 1.0).info("replication")
        offsets = [int((info.get(f"slave{i}") or {"offset": 0})["offset"])
                   for i in range(self.replicas)]
        return int(info["master_repl_offset"]) - max(offsets)

    def stop(self) -> None:
        """Stop the Sentinels first (no failover while the servers stop), then the servers."""
        for process in self.sentinels:
            _stop_process(process, 10.0)
        for server in self.servers.values():
            if server.process is not None and server.process.poll() is None:
                server.process.send_signal(signal.SIGCONT)  # a frozen one must hear SIGTERM
            server.stop()

    def __enter__(self) -> "SentinelTopology":
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


class SentinelCluster:
    """A :class:`~tasks.dev.cluster.LocalCluster` whose every process reaches Redis
    through the Sentinels of ``topology``, with ``beats`` beats in all (one leads), and
    a Prometheus exporter (``lanes exporter``) on ``exporter_port``.

    Construct it once ``GPULANES_BROKER_URL`` names ``topology.url``; the local
    cluster is given the primary as its Redis, so it starts none of its own.
    """

    def __init__(self, state: Path, topology: SentinelTopology, *, workers: int = 2,
                 beats: int = 2) -> None:
        from tasks.dev.cluster import LocalCluster

        self.local = LocalCluster(state, workers=workers, device="cpu", beat=True, env={
            "GPULANES_BROKER_URL": topology.url, "GPULANES_SENTINEL_MASTER": MASTER})
        self.local.redis = topology.server(topology.first_primary)  # it answers: reused
        self.beats, self.standbys = beats, []
        self.log_dir = self.local.log_dir
        self.exporter: subprocess.Popen | None = None
        self.exporter_port = free_port()

    def start(self, app: Any, timeout_s: float = 120.0) -> "SentinelCluster":
        """Start the workers and every beat; return once each worker answers."""
        from gpu_worker.processes import spawn

        self.local.start(app, timeout_s)
        for index in range(2, self.beats + 1):
            log = open(self.log_dir / f"beat{index}.log", "ab")
            self.standbys.append(spawn(
                [sys.executable, "-m", "celery", "-A", "tasks", "beat", "--loglevel", "INFO"],
                env=self.local.env, stdout=log, stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL))
        self.exporter = spawn(
            [sys.executable, "-m", "celery", "-A", "tasks", "lanes", "exporter",
             f"--port={self.exporter_port}"], env=self.local.env,
            stdout=open(self.log_dir / "exporter.log", "ab"), stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL)
        return self

    def beat_pids(self) -> dict[str, int]:
        """``{"beat": pid, "beat2": pid, ...}``."""
        beats = [self.local.beat, *self.standbys] if self.local.beat else self.standbys
        return {("beat" if i == 0 else f"beat{i + 1}"): p.pid for i, p in enumerate(beats)}

    def stop(self, workers_s: float = 30.0) -> None:
        """Stop the beats, then the workers (waiting at most ``workers_s`` for them)."""
        for process in [*self.standbys, self.exporter]:
            _stop_process(process, 10.0)
        _stop_process(self.local.beat, 10.0)
        self.local.stop_workers(workers_s)

    def __enter__(self) -> "SentinelCluster":
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def _stop_process(process: subprocess.Popen | None, timeout_s: float) -> None:
    """SIGTERM ``process`` and wait ``timeout_s``; SIGKILL it if it is still there."""
    if process is None or process.poll() is not None:
        return
    process.terminate()
    try:
        process.wait(timeout_s)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()
