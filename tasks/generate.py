"""The ``generate`` task: run one job on this worker's warm model, write its PNG."""
from __future__ import annotations

import logging
import sys
import time
from functools import lru_cache
from typing import Any

import redis

import celeryconfig as cfg
from gpu_worker.runtime import RUNTIME
from routing.names import GENERATE_TASK, attempts_key
from routing.store import connect
from tasks.celeryapp import app
from tasks.artifacts import save_png
from tasks.errors import JobFailed, JobTimeout
from tasks.retry import backoff_s, is_transient

log = logging.getLogger(__name__)


@lru_cache(maxsize=1)
def _redis() -> redis.Redis:
    return connect(app.conf.broker_url)


def _count_attempt(job_id: str) -> int:
    """Runs started for this job, redeliveries included (a Redis counter)."""
    key = attempts_key(job_id)
    with _redis().pipeline() as pipe:
        attempt, _ = pipe.incr(key).expire(key, cfg.VISIBILITY_TIMEOUT_S * 2).execute()
    return int(attempt)


def _deadline_guard(deadline: float):
    def on_step(step: int) -> None:
        if time.monotonic() > deadline:
            raise JobTimeout(f"ran past GPULANES_MAX_JOB_S={cfg.MAX_JOB_S:g}s at step {step}")
    return on_step


def _run(job: dict) -> tuple[Any, float, float | None]:
    """Generate on the warm model: (pixels, run_ms, load_ms if it had to load)."""
    model, load_ms = RUNTIME.model(job["model"])
    began = time.perf_counter()
    pixels = model.generate(job["prompt"], seed=job["seed"], steps=job["steps"],
                            width=job["width"], height=job["height"],
                            on_step=_deadline_guard(time.monotonic() + cfg.MAX_JOB_S))
    return pixels, (time.perf_counter() - began) * 1000, load_ms


def _fail_or_retry(task: Any, exc: Exception, attempt: int) -> None:
    """Retry a transient failure with backoff; anything else fails for good."""
    what = f"job {task.request.id} failed on attempt {attempt}: {type(exc).__name__}: {exc}"
    if not is_transient(exc):
        raise JobFailed(what) from exc
    if attempt > cfg.MAX_RETRIES:
        raise JobFailed(f"{what} (gave up after {attempt} attempts)") from exc
    torch = sys.modules.get("torch")
    if torch is not None and torch.cuda.is_available():
        torch.cuda.empty_cache()  # hand fragmented cache back before the retry
    countdown = backoff_s(attempt, cfg.RETRY_BASE_S, cfg.RETRY_CAP_S)
    log.warning("%s; retrying in %.2fs", what, countdown)
    raise task.retry(exc=exc, countdown=countdown, max_retries=None)


@app.task(bind=True, name=GENERATE_TASK)
def generate(self, job: dict, route: dict, submitted_at: float) -> dict:
    """Run one validated job (see ``tasks.api.submit``) and describe the result."""
    started_at = time.time()
    attempt = _count_attempt(self.request.id)
    if attempt > cfg.MAX_RETRIES + 1:  # redelivered after killing workers too often
        raise JobFailed(f"job {self.request.id} was lost with its worker {attempt - 1} times")
    try:
        pixels, run_ms, load_ms = _run(job)
    except Exception as exc:  # noqa: BLE001  sorted into retry or failure below
        _fail_or_retry(self, exc, attempt)
    image = save_png(cfg.ARTIFACT_DIR, self.request.id, pixels)
    return {
        **route, "job_id": self.request.id, "image": str(image),
        "lane": self.request.delivery_info.get("routing_key"),
        "worker": self.request.hostname, "device": RUNTIME.device, "started_at": started_at,
        "queued_ms": round((started_at - submitted_at) * 1000, 1),
        "run_ms": round(run_ms, 1), "attempts": attempt, "cached": False,
        "cold_start": load_ms is not None, "load_ms": round(load_ms or 0.0, 1),
        **{k: job[k] for k in ("model", "seed", "steps", "width", "height")},
    }
