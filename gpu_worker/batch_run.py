"""Running one group of the batcher: a batched pass, and what to do when it fails.

A failed pass must not fail jobs that would have succeeded alone, so the
group is run again in parts: halves after an out-of-memory error (the same
jobs in less memory), single jobs after anything else (only the culprit
fails). A model without ``generate_batch`` runs its group one job at a time.
"""
from __future__ import annotations

import logging
import sys
import time
from typing import Any

from gpu_worker.batching import Batcher, Pending, Ran, capacity_from_env
from gpu_worker.runtime import RUNTIME
from tasks.errors import JobTimeout
from tasks.jobs import catalog
from tasks.settings import settings

log = logging.getLogger(__name__)


def is_oom(exc: BaseException) -> bool:
    """torch's CUDA out-of-memory error (also what the test model raises)."""
    torch = sys.modules.get("torch")
    return torch is not None and isinstance(exc, torch.cuda.OutOfMemoryError)


def free_cache() -> None:
    """Hand the allocator's cached blocks back before trying in less memory."""
    torch = sys.modules.get("torch")
    if torch is not None and torch.cuda.is_available():
        torch.cuda.empty_cache()


class DroppedOut(Exception):
    """Jobs of a pass whose own check failed between steps: (job, error) pairs."""

    def __init__(self, dropped: list[tuple[Pending, BaseException]]) -> None:
        super().__init__(f"{len(dropped)} job(s) dropped out of the pass")
        self.dropped = dropped


def deadline_guard(group: list[Pending]):
    """Between steps: stop once the earliest job of the pass is past GPULANES_MAX_JOB_S,
    or once a job's own check fails (it drops out; the others run again without it)."""
    deadline = min(item.deadline for item in group)

    def on_step(step: int, steps: int | None = None) -> None:
        if time.monotonic() > deadline:
            raise JobTimeout(f"ran past GPULANES_MAX_JOB_S={settings.max_job_s:g}s at step {step}")
        dropped = []
        for item in group:
            try:
                item.check(step, steps)
            except Exception as exc:  # noqa: BLE001  the job's own verdict, settled as its own
                dropped.append((item, exc))
        if dropped:
            raise DroppedOut(dropped)
    return on_step


def forward(model: Any, group: list[Pending]) -> list[Any]:
    """One pass over the group's jobs (same model and batch key): their images, or a
    class model's outputs."""
    if hasattr(model, "predict"):
        return _predict_pass(model, group)
    first = group[0].job.inputs
    shape = {"steps": first["steps"], "width": first["width"], "height": first["height"]}
    guard = deadline_guard(group)

    def on_step(i: int) -> None:  # an image model counts its steps from 0
        guard(i + 1, shape["steps"])

    if len(group) == 1:
        return [model.generate(first["prompt"], seed=first["seed"], **shape, on_step=on_step)]
    return list(model.generate_batch([p.job.inputs["prompt"] for p in group],
                                     [p.job.inputs["seed"] for p in group], **shape,
                                     on_step=on_step))


def _predict_pass(model: Any, group: list[Pending]) -> list[Any]:
    inputs = [model.Input.model_validate(dict(item.job.inputs)) for item in group]
    guard = deadline_guard(group)

    def progress(done: int, total: int | None = None, state: Any = None) -> None:
        guard(done, total)

    if len(group) == 1:
        return [model.predict(inputs[0], progress)]
    return list(model.predict_batch(inputs, progress))


def settle(item: Pending, ran: Ran | None = None, error: BaseException | None = None) -> None:
    """Hand a job its outcome and wake its task thread."""
    item.ran, item.error = ran, error
    item.done.set()


def run_group(group: list[Pending]) -> None:
    """Run the group as one pass, or in parts after a failure; settle every job."""
    try:
        model, load_ms = RUNTIME.model(group[0].job.model)
    except Exception as exc:  # noqa: BLE001  every job gets the load error as its own
        for item in group:
            settle(item, error=exc)
        return
    if len(group) > 1 and not (hasattr(model, "generate_batch")
                               or hasattr(model, "predict_batch")):
        for item in group:
            run_group([item])
        return
    began = time.monotonic()
    try:
        images = forward(model, group)
        if len(images) != len(group):
            raise ValueError(f"{group[0].job.model}: its batched pass returned "
                             f"{len(images)} outcomes for {len(group)} jobs")
    except Exception as exc:  # noqa: BLE001  sorted below: split, one by one, or its own
        _after_failure(group, exc)
        return
    _settle_pass(group, images, began, load_ms)


def _settle_pass(group: list[Pending], images: list[Any], began: float,
                 load_ms: float | None) -> None:
    """Each job's image (or output); run_ms is its share of the pass's time (GPU time
    per job)."""
    pass_ms = (time.monotonic() - began) * 1000
    predicted = catalog.spec(group[0].job.model).cls is not None
    for item, made in zip(group, images):
        settle(item, Ran(None if predicted else made, pass_ms / len(group), load_ms,
                         len(group), max(0.0, (began - item.arrived) * 1000),
                         output=made if predicted else None))


def _after_failure(group: list[Pending], exc: Exception) -> None:
    if isinstance(exc, DroppedOut):
        for item, error in exc.dropped:
            settle(item, error=error)
        rest = [item for item in group if not item.done.is_set()]
        if rest:
            run_group(rest)
        return
    if len(group) == 1:
        settle(group[0], error=exc)
        return
    if is_oom(exc):
        free_cache()
        half = len(group) // 2
        log.warning("batched pass of %d ran out of memory; trying halves of %d and %d",
                    len(group), half, len(group) - half)
        run_group(group[:half])
        run_group(group[half:])
        return
    log.warning("batched pass of %d failed (%s: %s); running its jobs one by one",
                len(group), type(exc).__name__, exc)
    for item in group:
        run_group([item])


#: The one batcher of this worker process; its runner starts with the first job.
BATCHER = Batcher(run_group, capacity_from_env())
