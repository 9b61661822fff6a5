"""A plain Celery app on gpulanes' transport (``gpulanes+<broker url>``), for the tests
that run Celery's own features over it: tasks, priorities, remote control, events."""
from __future__ import annotations

import os
import time

from celery import Celery

import tasks.broker.lanes  # noqa: F401  registers the transport

BROKER = os.environ.get("LANES_APP_BROKER", "")
app = Celery("lanes_app", broker=f"gpulanes+{BROKER}",
             backend=BROKER.replace("redis+socket://", "redis+socket://"))
app.conf.update(task_serializer="json", accept_content=["json"], result_serializer="json",
                task_acks_late=True, worker_prefetch_multiplier=1,
                broker_transport_options={"priority_steps": [0, 1, 3, 6, 9]},
                task_default_queue="lo", worker_hijack_root_logger=False,
                worker_send_task_events=True)


@app.task(name="add")
def add(x: int, y: int) -> int:
    return x + y


@app.task(name="nap")
def nap(seconds: float, tag: str = "") -> str:
    time.sleep(seconds)
    with open(os.environ["LANES_APP_LOG"], "a") as log:
        log.write(f"{tag}\n")
    return tag
