"""The plain Celery side of ``benchmarks/perjob.py``: a default Celery app, as a plain
user writes it, with a task that does the ``echo`` model's work (nothing).

Never imports gpulanes. Its broker and result backend are the URL in
``PERJOB_BROKER_URL``; the settings a careful plain user sets for GPU jobs: late
acks, one job prefetched, the STARTED state tracked (gpulanes stores it too), a Redis
result backend. The worker runs as ``celery -A benchmarks.perjob_plain worker --pool
threads -c 1 -E -Q standard``. Run as ``python -m benchmarks.perjob_plain``, it is the
caller: it reads one JSON command a line (``["send", 50]``, ``["fetch"]``,
``["pickup"]``, ``["ready", 60]``) and answers each with one JSON line.
"""
from __future__ import annotations

import json
import os
import sys
import time
from typing import Any

from celery import Celery

URL = os.environ.get("PERJOB_BROKER_URL", "redis://localhost:6379/0")
QUEUE = "standard"
app = Celery("plain", broker=URL, backend=URL)
app.conf.update(task_acks_late=True, worker_prefetch_multiplier=1, task_track_started=True)


@app.task(name="perjob.echo")
def echo(text: str) -> dict:
    """What the ``echo`` model returns, and when the job started (unix time)."""
    return {"text": text, "started_at": time.time()}


# --- the caller ----------------------------------------------------------------------
_sent: list[Any] = []


def send(jobs: int) -> list[str]:
    """Send ``jobs`` jobs by ``apply_async``; their ids (kept for :func:`fetch`)."""
    _sent[:] = [echo.apply_async(args=[f"job {i}"], queue=QUEUE) for i in range(jobs)]
    return [result.id for result in _sent]


def fetch() -> int:
    """``.get()`` every job :func:`send` sent; how many."""
    for result in _sent:
        result.get(timeout=60)
    return len(_sent)


def pickup() -> float:
    """Seconds from just before one job's send to its start on the worker."""
    began = time.time()
    return echo.apply_async(args=["pickup"], queue=QUEUE).get(timeout=60)["started_at"] - began


def ready(timeout_s: float) -> bool:
    """Whether a worker answered a ping within ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if app.control.ping(timeout=1):
            return True
    return False


COMMANDS = {"send": send, "fetch": fetch, "pickup": pickup, "ready": ready}


def serve() -> None:
    """Answer the commands on stdin, one JSON line each, until stdin closes."""
    for line in sys.stdin:
        name, *args = json.loads(line)
        print(json.dumps(COMMANDS[name](*args)), flush=True)


if __name__ == "__main__":
    serve()
