"""Running one job on this worker's warm model, and keeping what it made.

An image model (the built-in demo family: ``generate``) makes pixels, stored as
the job's PNG; a model of the general contract (``predict``) gets its validated
``Input`` and returns a dict, stored as the job's ``output``
(``tasks.worker.outputs``). Both report each finished step to ``on_step``, which
raises to stop the run (revoked, taken over, past ``GPULANES_MAX_JOB_S``).
"""
from __future__ import annotations

import time
from typing import Any, Callable

from gpu_worker.batch_run import BATCHER
from gpu_worker.batching import Ran
from gpu_worker.runtime import RUNTIME
from tasks.broker.message import Job
from tasks.jobs import catalog
from tasks.settings import settings
from tasks.worker.outputs import stored_output
from tasks.worker.png import store_png


def run_job(job: Job, lane: str, on_step: Callable[[int], None]) -> Ran:
    """Run ``job`` on the warm model: alone, or through the batcher when the model batches
    or the worker has several pool threads (its runner makes one pass at a time, so
    jobs of a model that does not batch never share the device)."""
    if settings.for_model(settings.max_batch, job.model) > 1 or (BATCHER.capacity or 1) > 1:
        return BATCHER.run(job, lane, on_step)  # the batcher's runner loads the model
    if catalog.spec(job.model).cls is not None:
        return _predict(job, on_step)
    model, load_ms = RUNTIME.model(job.model)
    began, inputs = time.perf_counter(), job.inputs
    pixels = model.generate(inputs["prompt"], seed=inputs["seed"], steps=inputs["steps"],
                            width=inputs["width"], height=inputs["height"], on_step=on_step)
    return Ran(pixels, (time.perf_counter() - began) * 1000, load_ms)


def _predict(job: Job, on_step: Callable[[int], None]) -> Ran:
    model, load_ms = RUNTIME.model(job.model)
    inputs = model.Input.model_validate(dict(job.inputs))  # the producer's checks, again

    def progress(done: int, total: int | None = None) -> None:
        on_step(done)

    began = time.perf_counter()
    output = model.predict(inputs, progress)
    return Ran(None, (time.perf_counter() - began) * 1000, load_ms, output=output)


def kept(job_id: str, run: int, ran: Ran) -> dict[str, Any]:
    """What the run made, stored: the result's ``image`` fields, or its ``output``."""
    if ran.output is not None or ran.pixels is None:
        return {"output": stored_output(job_id, run, ran.output)}
    ref = store_png(job_id, ran.pixels, run)  # the artifact store: a local path by default
    return {"image": ref.url, "bytes": ref.bytes, "sha256": ref.sha256}
