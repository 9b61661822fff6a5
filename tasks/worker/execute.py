"""Running one job on this worker's warm model, and keeping what it made.

An image model (the built-in demo family: ``generate``) makes pixels, stored as
the job's PNG; a model of the general contract (``predict``) gets its validated
``Input`` and returns a dict, stored as the job's ``output``
(``tasks.worker.outputs``). Both report each finished step to the run's
``StepGuard``, which raises to stop the run (revoked, taken over, past
``GPULANES_MAX_JOB_S``, preempted) and else reports its progress. A model that
declares ``preemptible`` may be stopped for a fast job; one that is ``resumable``
hands its state with each step (``keep(step, state)``, or
``progress(done, total, state)``), takes it back as ``resume=(step, state)``, and is
preemptible unless it says ``preemptible = False``.
"""
from __future__ import annotations

import time
from typing import Any

from gpu_worker.batch_run import BATCHER
from gpu_worker.batching import Ran
from gpu_worker.lease import Lease
from gpu_worker.preempt import PREEMPTION
from gpu_worker.runtime import RUNTIME
from tasks.broker.message import Job
from tasks.jobs import catalog
from tasks.jobs.artifacts import IMAGE
from tasks.settings import settings
from tasks.worker.outputs import Blob, encoded_output, with_references
from tasks.worker.png import PNG, png_bytes
from tasks.worker.saving import write_all
from tasks.worker.steps import StepGuard


def run_job(job: Job, lane: str, guard: StepGuard,
            resume: tuple[int, Any] | None = None) -> Ran:
    """Run ``job`` on the warm model: alone, or through the batcher when the model batches
    or the worker has several pool threads (its runner makes one pass at a time, so
    jobs of a model that does not batch never share the device; a pass is never
    preempted). ``resume``: (step, state) a preempted run of the job left here."""
    if settings.for_model(settings.max_batch, job.model) > 1 or (BATCHER.capacity or 1) > 1:
        return BATCHER.run(job, lane, guard)  # the batcher's runner loads the model
    model, load_ms = RUNTIME.model(job.model)
    guard.began = time.monotonic()  # a cold load is nobody's fast time
    guard.alone = True
    guard.preemptible = is_preemptible(model)
    if guard.preemptible and _may_run_long(job):
        PREEMPTION.offer(lane, guard.preempted, guard.step)
        try:
            return _run_alone(model, load_ms, job, guard, resume)
        finally:
            PREEMPTION.withdraw()
    return _run_alone(model, load_ms, job, guard, resume)


def is_preemptible(model: Any) -> bool:
    """Whether runs of ``model`` may step aside for a fast job: its ``preemptible``,
    which defaults to its ``resumable`` (a model that can pick up where it stopped)."""
    declared = getattr(model, "preemptible", None)
    return bool(getattr(model, "resumable", False) if declared is None else declared)


def _may_run_long(job: Job) -> bool:
    """Whether ``job`` may run ``preempt_min_left_s`` or longer, by this worker's
    recent jobs of its model (none yet: it may). A shorter one is never preempted
    (``StepGuard``): it stays out of the index of preemptible runs, two calls saved."""
    fit = RUNTIME.cost_fits.get(job.model)
    if fit is None or fit.n <= 0:
        return True
    base_ms, unit_ms = fit.line()
    return (base_ms + unit_ms * job.cost) / 1000 >= settings.preempt_min_left_s


def _run_alone(model: Any, load_ms: float | None, job: Job, guard: StepGuard,
               resume: tuple[int, Any] | None) -> Ran:
    """One job on its own on the warm model (see :func:`run_job`)."""
    resumable = bool(getattr(model, "resumable", False))
    began = time.perf_counter()
    if catalog.spec(job.model).cls is not None:
        output = _predict(model, job, guard, resume if resumable else None, resumable)
        return Ran(None, (time.perf_counter() - began) * 1000, load_ms, output=output)
    inputs, steps = job.inputs, job.inputs["steps"]
    extra = {"keep": guard.keep, "resume": resume} if resumable else {}
    pixels = model.generate(inputs["prompt"], seed=inputs["seed"], steps=steps,
                            width=inputs["width"], height=inputs["height"],
                            on_step=lambda i: guard(i + 1, steps), **extra)
    return Ran(pixels, (time.perf_counter() - began) * 1000, load_ms)


def _predict(model: Any, job: Job, guard: StepGuard, resume: tuple[int, Any] | None,
             resumable: bool) -> Any:
    inputs = model.Input.model_validate(dict(job.inputs))  # the producer's checks, again

    def progress(done: int, total: int | None = None, state: Any = None) -> None:
        if resumable and state is not None:  # what resuming after this step starts from
            guard.keep(done, state)
        guard(done, total)

    return model.predict(inputs, progress, **({"resume": resume} if resume else {}))


def kept(job_id: str, lease: Lease, ran: Ran, started_at: float) -> dict[str, Any]:
    """What ``lease``'s run (begun at unix time ``started_at``) made, stored: the result's
    ``image`` fields, or its ``output``. All of it is encoded first and held in memory
    while a refusing store is waited out (``tasks.worker.saving``): a finished model's
    work is not lost to a full disk."""
    if ran.output is not None or ran.pixels is None:
        encoded, blobs = encoded_output(ran.output)
        refs = write_all(job_id, lease, blobs, started_at)
        return {"output": with_references(encoded, refs)}
    image = Blob(IMAGE, png_bytes(ran.pixels), PNG)
    ref = write_all(job_id, lease, [image], started_at)[IMAGE]  # url: a local path by default
    return {"image": ref.url, "bytes": ref.bytes, "sha256": ref.sha256}
