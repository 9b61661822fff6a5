"""Webhooks as a test meets them: the sender, ``celery -A tasks lanes webhooks``, in its
own process group, and a receiver in the test's process that records each delivery and
can be down (503), or hold its answers until released."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from tests.harness.http import ROOT


class Sender:
    """``with Sender(log_dir, env) as sender: ...``; :meth:`kill` is SIGKILL."""

    def __init__(self, log_dir: Path, env: dict[str, str] | None = None,
                 name: str = "webhooks") -> None:
        self.log_path = Path(log_dir) / f"{name}.log"
        self.env = {**os.environ, **(env or {})}
        self.proc: subprocess.Popen | None = None

    def start(self) -> Sender:
        from gpu_worker.processes import spawn

        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.log_path, "ab") as log:
            self.proc = spawn([sys.executable, "-m", "celery", "-A", "tasks", "lanes",
                               "webhooks"], cwd=ROOT, env=self.env, stdout=log,
                              stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        return self

    def kill(self) -> None:
        """SIGKILL: whatever it was sending, it says nothing more."""
        if self.proc is not None and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(timeout=10)

    def stop(self, timeout_s: float = 20.0) -> None:
        if self.proc is None or self.proc.poll() is not None:
            return
        self.proc.terminate()
        try:
            self.proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            self.kill()

    def __enter__(self) -> Sender:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


@dataclass
class Delivery:
    """One request the receiver got: its headers, raw body and the body parsed."""

    headers: dict[str, str]
    raw: bytes
    body: dict[str, Any] = field(default_factory=dict)


class Receiver:
    """An HTTP server on a free loopback port that records every POST and answers
    ``status`` (200: taken; 503 while :attr:`down`), or holds each answer while
    :attr:`held` is set, until it is cleared or the server closes."""

    def __init__(self) -> None:
        self.got: list[Delivery] = []
        self.tried = 0  #: requests that reached it, answered or not
        self.down = False
        self.held = threading.Event()
        self.released = threading.Event()
        self.lock = threading.Lock()
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802  (http.server's name)
                raw = self.rfile.read(int(self.headers.get("content-length") or 0))
                with receiver.lock:
                    receiver.tried += 1
                if receiver.held.is_set():
                    receiver.released.wait(60)
                    return  # no answer at all: the sender times out
                status = 503 if receiver.down else 200
                if status == 200:
                    with receiver.lock:
                        receiver.got.append(Delivery(
                            {k.lower(): v for k, v in self.headers.items()}, raw,
                            json.loads(raw)))
                self.send_response(status)
                self.send_header("content-length", "0")
                self.end_headers()

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/hook"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def events(self, job_id: str) -> list[tuple[str, str]]:
        """(webhook-id, status) of each delivery of prediction ``job_id`` taken so far."""
        with self.lock:
            return [(d.headers["webhook-id"], d.body.get("status")) for d in self.got
                    if d.body.get("id") == job_id]

    def close(self) -> None:
        self.released.set()
        self.server.shutdown()
        self.server.server_close()

    def __enter__(self) -> Receiver:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
