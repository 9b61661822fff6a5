"""A local cluster in child processes: embedded Redis, the GPU workers, beat.

``make demo``, the tests and the benchmarks all run on this. The caller's own
process must use the same broker: point ``GPULANES_BROKER_URL`` at
``cluster.url`` before importing ``tasks``, or use the default state folder.
"""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from gpu_worker.processes import spawn
from gpu_worker.redis_server import EmbeddedRedis
from routing.names import worker_hostname
from tasks.broker.eviction import check_no_eviction
from tasks.errors import GpulanesError
from tasks.settings import settings


class LocalCluster:
    """Start with ``with LocalCluster(...) as cluster:``; everything stops on exit."""

    def __init__(self, state_dir: Path, *, workers: int = 2, device: str = "auto",
                 beat: bool = True, env: dict[str, str] | None = None,
                 log_dir: Path | None = None, concurrency: int | None = None) -> None:
        self.redis = EmbeddedRedis(Path(state_dir))
        self.workers, self.device, self.with_beat = workers, device, beat
        self.concurrency = concurrency  # jobs each worker runs at once (None: its default)
        self.log_dir = Path(log_dir or state_dir)
        self.env = {**os.environ, "GPULANES_BROKER_URL": self.redis.url,
                    "GPULANES_STATE_DIR": str(state_dir), **(env or {})}
        self.supervisor: subprocess.Popen | None = None
        self.beat: subprocess.Popen | None = None
        self.owns_redis = False

    @property
    def url(self) -> str:
        return self.redis.url

    @property
    def hostnames(self) -> list[str]:
        node = os.uname().nodename
        return [worker_hostname(i).replace("%h", node) for i in range(self.workers)]

    def _spawn(self, name: str, args: list[str]) -> subprocess.Popen:
        self.log_dir.mkdir(parents=True, exist_ok=True)
        log = open(self.log_dir / f"{name}.log", "ab")
        return spawn([sys.executable, *args], env=self.env, stdout=log,
                     stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)

    def start_workers(self) -> None:
        more = ["--concurrency", str(self.concurrency)] if self.concurrency else []
        self.supervisor = self._spawn("workers", [
            "-m", "gpu_worker", "--workers", str(self.workers), "--device", self.device, *more])

    def start(self, app: Any, timeout_s: float = 120.0, fresh: bool = False) -> "LocalCluster":
        """Start everything and wait until every worker is warm and consuming.

        ``fresh``: empty a Redis this call starts, so jobs left in its AOF by
        an interrupted earlier run do not replay into this one. A Redis that may evict
        keys (one already serving this folder, set up by hand) is refused:
        :class:`~tasks.errors.ConfigError`, before any process starts.
        """
        if not self.redis.answers():  # else reuse the one already serving this folder
            self.redis.start()
            self.owns_redis = True
            if fresh:
                self.redis.client().flushall()
        check_no_eviction(self.redis.client())
        self.start_workers()
        if self.with_beat:
            self.beat = self._spawn("beat", ["-m", "celery", "-A", "tasks", "beat",
                                             "--loglevel", "INFO"])
        self.wait_for_workers(app, self.hostnames, timeout_s)
        return self

    def wait_for_workers(self, app: Any, hostnames: list[str], timeout_s: float) -> None:
        """Block until each named worker answers a ping (it pings once warm)."""
        deadline, missing = time.monotonic() + timeout_s, set(hostnames)
        log = self.log_dir / "workers.log"
        while missing:
            if self.supervisor is not None and (code := self.supervisor.poll()) is not None:
                raise GpulanesError(f"the worker supervisor exited with {code}; the end of "
                                    f"{log}:\n{log_tail(log)}")
            if time.monotonic() > deadline:
                raise GpulanesError(f"workers {sorted(missing)} not ready after {timeout_s:.0f}s;"
                                    f" the end of {log}:\n{log_tail(log)}")
            for reply in app.control.ping(timeout=0.5) or []:
                missing -= set(reply)

    def stop_workers(self, timeout_s: float | None = None) -> int | None:
        """SIGTERM the supervisor (a warm shutdown) and return its exit code:
        0 when every worker finished its job in time (default: a job's longest run)."""
        return _terminate(self.supervisor, timeout_s or settings.max_job_s + 60)

    def stop(self) -> None:
        _terminate(self.beat, 10.0)
        self.stop_workers()
        if self.owns_redis:
            self.redis.stop()

    def __enter__(self) -> "LocalCluster":
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


#: Lines of a log :func:`log_tail` shows, and how far back it reads for them.
TAIL_LINES, TAIL_BYTES = 8, 64 * 1024


def log_tail(path: Path, lines: int = TAIL_LINES) -> str:
    """The last ``lines`` lines of the log at ``path`` that say something, indented:
    traceback frames and blank lines left out, so a worker's error and the
    supervisor's last words fit in a terminal."""
    try:
        with open(path, "rb") as f:
            f.seek(max(0, f.seek(0, os.SEEK_END) - TAIL_BYTES))
            text = f.read().decode(errors="replace")
    except OSError as exc:
        return f"    (cannot read it: {exc})"
    said = [line for line in text.splitlines() if line.strip() and not line[0].isspace()
            and not line.startswith("Traceback (most recent call last)")]
    return "\n".join(f"    {line}" for line in said[-lines:]) or "    (empty)"


def _terminate(process: subprocess.Popen | None, timeout_s: float) -> int | None:
    if process is None:
        return None
    if process.poll() is None:
        process.send_signal(signal.SIGTERM)
    try:
        return process.wait(timeout_s)
    except subprocess.TimeoutExpired:
        process.kill()
        return process.wait()
