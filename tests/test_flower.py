"""Flower refuses to start open, and asks for the credentials it was given."""
from __future__ import annotations

import os
import subprocess
import sys

from conftest import free_port, http_status, wait_until

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _flower(env: dict, port: int, log=subprocess.PIPE) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "celery", "-A", "tasks", "flower",
                             f"--port={port}", "--address=127.0.0.1"], cwd=ROOT, env=env,
                            stdout=log, stderr=subprocess.STDOUT, text=True)


def _stop(proc: subprocess.Popen) -> None:
    """SIGTERM, as an operator's stop would send; SIGKILL if Flower lingers on its
    own shutdown (its executor threads are joined at exit), as Docker would."""
    proc.terminate()
    try:
        proc.wait(timeout=20)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(timeout=20)


def _status(port: int, auth: str | None = None) -> int | None:
    return http_status(f"http://127.0.0.1:{port}/workers", auth)


def test_flower_will_not_start_without_auth(redis_server):
    env = {k: v for k, v in os.environ.items() if not k.startswith("FLOWER_")}
    proc = _flower(env, free_port())
    out, _ = proc.communicate(timeout=60)
    assert proc.returncode != 0 and "without authentication" in out


def test_flower_requires_its_credentials(redis_server, tmp_path):
    port = free_port()
    with open(tmp_path / "flower.log", "w") as log:  # a file: a pipe nobody reads can fill
        proc = _flower({**os.environ, "FLOWER_BASIC_AUTH": "ops:s3cret"}, port, log)
    try:
        assert wait_until(lambda: _status(port), timeout_s=60, what="Flower to answer") == 401
        assert _status(port, "ops:wrong") == 401
        assert _status(port, "ops:s3cret") == 200
    finally:
        _stop(proc)
