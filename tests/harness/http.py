"""The HTTP API as an operator runs it: ``celery -A tasks lanes api`` in its own process
group (uvicorn and its worker processes) on a free port, logging to a file, stopped with
SIGTERM as Docker stops it."""
from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent.parent


def free_port() -> int:
    """A TCP port nobody listens on now."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _answers(url: str) -> bool:
    try:
        return urllib.request.urlopen(url, timeout=2).status == 200
    except (urllib.error.URLError, OSError):
        return False


class ApiServer:
    """``with ApiServer(log_dir, workers=2) as api: httpx.get(api.url + "/docs")``."""

    def __init__(self, log_dir: Path, *, workers: int = 1, env: dict[str, str] | None = None,
                 name: str = "api") -> None:
        self.log_path = Path(log_dir) / f"{name}.log"
        self.workers, self.env = workers, {**os.environ, **(env or {})}
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.proc: subprocess.Popen | None = None

    def start(self, timeout_s: float = 60.0) -> ApiServer:
        """Start it and wait until it answers (its OpenAPI document needs no key)."""
        from gpu_worker.processes import spawn

        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.log_path, "ab") as log:
            self.proc = spawn([sys.executable, "-m", "celery", "-A", "tasks", "lanes", "api",
                               "--port", str(self.port), "--workers", str(self.workers)],
                              cwd=ROOT, env=self.env, stdout=log, stderr=subprocess.STDOUT,
                              stdin=subprocess.DEVNULL)
        deadline = time.monotonic() + timeout_s
        while not _answers(f"{self.url}/openapi.json"):
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(f"the API did not start; see {self.log_path}:\n"
                                   f"{self.log_path.read_text()[-3000:]}")
            time.sleep(0.1)
        return self

    def stop(self, timeout_s: float = 20.0) -> int | None:
        """SIGTERM to the server (it stops its worker processes), SIGKILL to its process
        group if it lingers; its exit status."""
        if self.proc is None:
            return None
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=timeout_s)
            except subprocess.TimeoutExpired:
                pass
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)  # anything of it left behind
        except ProcessLookupError:
            pass
        return self.proc.wait(timeout=timeout_s)

    def __enter__(self) -> ApiServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
