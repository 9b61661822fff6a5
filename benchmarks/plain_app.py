"""The plain Celery side of the lane benchmarks: a default Celery app, as a careful
plain user writes it for GPU jobs.

A stock ``Celery("plain", broker=URL, backend=URL)`` on kombu's own Redis transport
and Celery's own Redis result backend, at the URL in ``PLAIN_BROKER_URL`` (the
benchmarks give it a Redis database of its own). The settings such a user sets: late
acks, one job prefetched, JSON only, the started state tracked, and the three queues
``fast``, ``standard``, ``relaxed`` declared and read in the ``-Q`` order
(``queue_order_strategy="priority"``, kombu >= 5.7). Its workers run, each in its own
process, as ``celery -A benchmarks.plain_app worker --pool threads -c 1 -E
-Q fast,standard,relaxed`` (events on, as for Flower); see ``benchmarks.plain_run``.

The task does a gpulanes job's work: the ``demo`` model, loaded by its own loader
(``gpu_worker.demo_model.load``) once per worker process and kept, up to
``PLAIN_MODEL_SLOTS`` models (least recently used evicted), one image per job written
as a PNG, torch on one thread (as gpulanes' worker sets it). That module imports
gpulanes' error, settings and key-name leaves, never its Celery app, transport or
backend: the worker checks this once its model is loaded. A result carries the timing
fields the benchmarks read, in gpulanes' names (``queued_ms`` from the ``submitted_at``
its publisher stamps). No policy, no routing, no progress reports.
"""
from __future__ import annotations

import os
import sys
import threading
import time
from collections import OrderedDict
from pathlib import Path
from typing import Any

from celery import Celery
from celery.signals import worker_init

from benchmarks.common import JobSize

QUEUES = ("fast", "standard", "relaxed")
URL = os.environ.get("PLAIN_BROKER_URL", "redis://localhost:6379/1")
GATE_TIMEOUT_S = 60.0
#: gpulanes modules that would mean the plain side is not plain.
NOT_PLAIN = ("tasks.broker.app", "tasks.broker.lanes", "tasks.broker.backend", "tasks.api")

app = Celery("plain", broker=URL, backend=URL)
app.conf.update(
    task_acks_late=True, worker_prefetch_multiplier=1, task_track_started=True,
    task_serializer="json", result_serializer="json", accept_content=["json"],
    task_queues={name: {} for name in QUEUES}, task_default_queue="standard",
    task_create_missing_queues=False,
    broker_transport_options={"queue_order_strategy": "priority"})


def check_plain(where: str) -> None:
    """Raise if this process holds gpulanes' app, transport, backend or client."""
    found = [name for name in NOT_PLAIN if name in sys.modules]
    if found:
        raise RuntimeError(f"{where} is not plain Celery: it imported {', '.join(found)}")


# --- worker side ------------------------------------------------------------------
class Models:
    """Loaded models by name, at most ``slots`` (least recently used evicted)."""

    def __init__(self, slots: int, model_dir: Path) -> None:
        self.slots, self.model_dir = slots, model_dir
        self.loaded: OrderedDict[str, Any] = OrderedDict()
        self.lock = threading.Lock()

    def get(self, name: str) -> tuple[Any, float | None]:
        """(model, its load ms when this call loaded it, else None)."""
        from gpu_worker.demo_model import load

        with self.lock:
            if name in self.loaded:
                self.loaded.move_to_end(name)
                return self.loaded[name], None
            began = time.perf_counter()
            model = load(name=name, device="cpu", model_dir=self.model_dir)
            model.warmup()
            self.loaded[name] = model
            while len(self.loaded) > self.slots:
                self.loaded.popitem(last=False)
            return model, (time.perf_counter() - began) * 1000


MODELS = Models(int(os.environ.get("PLAIN_MODEL_SLOTS", "1")),
                Path(os.environ.get("PLAIN_MODEL_DIR", "/tmp/plain-models")))


@worker_init.connect
def load_models(**_: Any) -> None:
    """Warm the models named in ``PLAIN_WARM_MODELS`` before the worker consumes."""
    import torch

    torch.set_num_threads(1)
    for name in filter(None, os.environ.get("PLAIN_WARM_MODELS", "demo").split(",")):
        MODELS.get(name)
    check_plain("the plain worker")


def wait_gate(gate: str | None) -> None:
    """Hold until the file ``gate`` exists (at most ``GATE_TIMEOUT_S``): how a benchmark
    keeps a worker busy while it queues a backlog."""
    deadline = time.monotonic() + GATE_TIMEOUT_S
    while gate and not os.path.exists(gate) and time.monotonic() < deadline:
        time.sleep(0.0005)


@app.task(name="plain.generate", bind=True)
def generate(self: Any, prompt: str, seed: int, steps: int, width: int, height: int,
             submitted_at: float, model: str = "demo", gate: str | None = None) -> dict:
    """One image of ``model``, saved as a PNG; the timings gpulanes' results carry."""
    from PIL import Image

    started_at = time.time()
    wait_gate(gate)
    loaded, load_ms = MODELS.get(model)
    began = time.perf_counter()
    pixels = loaded.generate(prompt, seed=seed, steps=steps, width=width, height=height)
    run_ms = (time.perf_counter() - began) * 1000
    path = Path(os.environ.get("PLAIN_ARTIFACT_DIR", "/tmp/plain-artifacts")) / f"{self.request.id}.png"
    path.parent.mkdir(parents=True, exist_ok=True)
    Image.fromarray(pixels).save(path)
    return {"job_id": self.request.id, "image": str(path), "model": model,
            "worker": self.request.hostname, "lane": self.request.delivery_info["routing_key"],
            "started_at": started_at, "queued_ms": round((started_at - submitted_at) * 1000, 1),
            "run_ms": run_ms, "cold_start": load_ms is not None, "load_ms": load_ms or 0.0}


# --- client side -----------------------------------------------------------------------
def send(queue: str, prompt: str, seed: int, size: JobSize, *, model: str = "demo",
         gate: str | None = None) -> Any:
    """A plain user's publish: ``apply_async`` to the queue named like the tier."""
    return generate.apply_async(
        kwargs={"prompt": prompt, "seed": seed, "steps": size.steps, "width": size.size,
                "height": size.size, "submitted_at": time.time(), "model": model,
                "gate": gate}, queue=queue)


def depth() -> int:
    """Jobs waiting in the three queues (kombu keeps unprioritised messages in the
    queue's own list)."""
    with app.connection_for_read() as conn:
        client = conn.default_channel.client
        return sum(client.llen(name) for name in QUEUES)
