"""The plain Celery side of ``benchmarks/perjob.py``: a default Celery app, as a plain
user writes it, with a task that does nothing (the ``echo`` model's work).

Never imports gpulanes. Its broker and result backend are the URL in
``PERJOB_BROKER_URL``; the settings a careful plain user sets for GPU jobs: late
acks, one job prefetched, a Redis result backend. Run as
``celery -A benchmarks.perjob_plain worker --pool threads -c 1 -E``.
"""
from __future__ import annotations

import os

from celery import Celery

URL = os.environ.get("PERJOB_BROKER_URL", "redis://localhost:6379/0")
app = Celery("plain", broker=URL, backend=URL)
app.conf.update(task_acks_late=True, worker_prefetch_multiplier=1)


@app.task(name="perjob.echo")
def echo(text: str) -> dict:
    """What the ``echo`` model returns."""
    return {"text": text}
