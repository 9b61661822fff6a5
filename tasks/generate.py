"""The ``generate`` task: run one job on this worker's warm model, write its PNG.

A job id has one result, however often its message is delivered. One copy
runs at a time: it holds a lease in Redis, and a copy that finds the lease
taken steps aside (``Ignore``: acked, no state written). The first run to
finish stores its result under the id, and a later copy returns it.
"""
from __future__ import annotations

import json
import logging
import math
import sys
import time
from functools import lru_cache
from typing import Any, NoReturn

import redis
from celery.exceptions import Ignore

import celeryconfig as cfg
from gpu_worker.batching import BATCHER, Ran
from gpu_worker.runtime import RUNTIME
from routing.names import DUPLICATES_KEY
from routing.names import (FAST, GENERATE_TASK, USAGE_BUCKET_S, attempts_key, done_key,
                           fast_queued_key, lane_of, lease_key, metric_field, usage_key)
from routing.policy import RETRY, next_lane
from tasks.accounts import charge_fast_seconds
from tasks.artifacts import save_png
from tasks.celeryapp import app, redis_client
from tasks.cache import LEADS_RUN
from tasks.coalesce import close_run, fail_followers
from tasks.deadletter import bury
from tasks.errors import JobFailed, JobTimeout
import tasks.fastlimit  # noqa: F401  its handler frees a revoked job's place
from tasks.metrics import add_counts, job_counts
from tasks.rejects import CheckedTask
from tasks.retry import backoff_s, is_transient

log = logging.getLogger(__name__)


# KEYS: done, lease, attempts[, the account's fast places]. ARGV: holder, lease
# ttl, attempts ttl, job id.
_BEGIN = """
if KEYS[4] then redis.call('ZREM', KEYS[4], ARGV[4]) end
local done = redis.call('GET', KEYS[1])
if done then return {'done', done} end
if not redis.call('SET', KEYS[2], ARGV[1], 'NX', 'EX', ARGV[2]) then return {'busy', ''} end
local attempt = redis.call('INCR', KEYS[3])
redis.call('EXPIRE', KEYS[3], ARGV[3])
return {'run', tostring(attempt)}
"""
# A lease lapses before Redis' visibility timeout redelivers a dead runner's
# message, and the running worker extends it (gpu_worker.hooks.KeepHeld); beat
# drops a dead runner's lease at once.
LEASE_TTL_S = cfg.LEASE_TTL_S
# A job's run counter outlives every copy of it: redeliveries and each retry's run and backoff.
ATTEMPTS_TTL_S = math.ceil(2 * cfg.VISIBILITY_TIMEOUT_S
                           + (cfg.MAX_RETRIES + 1) * (cfg.MAX_JOB_S + cfg.RETRY_CAP_S))


@lru_cache(maxsize=1)
def _begin_script() -> Any:
    return redis_client().register_script(_BEGIN)


def _begin(job_id: str, job: dict, route: dict) -> tuple[int, dict | None]:
    """Take the job's lease and count this run; or its earlier result; or Ignore.

    A fast job gives back its account's fast place (``tasks.fastlimit``) here.
    """
    keys = [done_key(job_id), lease_key(job_id), attempts_key(job_id)]
    if route.get("requested_tier") == FAST:
        keys.append(fast_queued_key(job["account"]))
    verdict, value = _begin_script()(
        keys=keys, args=[RUNTIME.incarnation, LEASE_TTL_S, ATTEMPTS_TTL_S, job_id])
    if verdict == "busy":  # another copy runs now; it will store the result
        raise Ignore()
    return (0, json.loads(value)) if verdict == "done" else (int(value), None)


def _deadline_guard(deadline: float):
    def on_step(step: int) -> None:
        if time.monotonic() > deadline:
            raise JobTimeout(f"ran past GPULANES_MAX_JOB_S={cfg.MAX_JOB_S:g}s at step {step}")
    return on_step


def _run(job: dict, lane: str) -> Ran:
    """Generate on the warm model: alone, or through the batcher when the model batches
    or the worker has several pool threads (its runner makes one pass at a time, so
    jobs of a model that does not batch never share the device)."""
    if cfg.for_model(cfg.MAX_BATCH, job["model"]) > 1 or (BATCHER.capacity or 1) > 1:
        return BATCHER.run(job, lane)
    model, load_ms = RUNTIME.model(job["model"])
    began = time.perf_counter()
    pixels = model.generate(job["prompt"], seed=job["seed"], steps=job["steps"],
                            width=job["width"], height=job["height"],
                            on_step=_deadline_guard(time.monotonic() + cfg.MAX_JOB_S))
    return Ran(pixels, (time.perf_counter() - began) * 1000, load_ms)


def _lane(task: Any, route: dict) -> str:
    """The lane this run was taken from (a worker's own queue counts as its lane)."""
    return lane_of((task.request.delivery_info or {}).get("routing_key") or route["lane"])


def _give_up(task: Any, kwargs: dict, reason: str, exc: BaseException,
             attempt: int, what: str) -> NoReturn:
    bury(redis_client(), task.request.id, kwargs, reason, exc, attempt)
    with redis_client().pipeline() as pipe:
        pipe.delete(lease_key(task.request.id))
        add_counts(pipe, {metric_field("failures", _lane(task, kwargs["route"])): 1}).execute()
    if kwargs["job"].get(LEADS_RUN):
        fail_followers(task.request.id, what)
    raise JobFailed(what) from exc


def _fail_or_retry(task: Any, exc: Exception, attempt: int, kwargs: dict) -> NoReturn:
    """Retry a transient failure one lane down, after a backoff; else dead-letter it."""
    what = f"job {task.request.id} failed on attempt {attempt}: {type(exc).__name__}: {exc}"
    if not is_transient(exc):
        _give_up(task, kwargs, "error", exc, attempt, what)
    if attempt > cfg.MAX_RETRIES:
        _give_up(task, kwargs, "retries_exhausted", exc, attempt,
                 f"{what} (gave up after {attempt} attempts)")
    torch = sys.modules.get("torch")
    if torch is not None and torch.cuda.is_available():
        torch.cuda.empty_cache()  # hand fragmented cache back before the retry
    route = dict(kwargs["route"])
    lane = next_lane(route["lane"]) or route["lane"]
    if lane != route["requested_tier"]:
        route.update(lane=lane, downgraded_from=route["requested_tier"], downgrade_reason=RETRY)
    countdown = backoff_s(attempt, cfg.RETRY_BASE_S, cfg.RETRY_CAP_S)
    route["lane_since"] = time.time() + countdown  # its wait in the new lane starts then
    log.warning("%s; retrying in %s in %.2fs", what, lane, countdown)
    with redis_client().pipeline() as pipe:
        pipe.delete(lease_key(task.request.id))  # the retry is the next copy
        add_counts(pipe, {metric_field("retries", _lane(task, kwargs["route"])): 1}).execute()
    raise task.retry(exc=exc, countdown=countdown, max_retries=None,
                     kwargs={**kwargs, "route": route},
                     queue=lane, exchange=lane, routing_key=lane)


def _account_for(client: redis.Redis, result: dict, account: str) -> None:
    """Usage for fair relax; fast seconds only for a run in the fast lane."""
    run_s = result["run_ms"] / 1000
    bucket = usage_key(int(time.time()) // USAGE_BUCKET_S)
    with client.pipeline() as pipe:
        pipe.hincrbyfloat(bucket, account, run_s).expire(bucket, cfg.FAIR_WINDOW_S + USAGE_BUCKET_S)
        add_counts(pipe, job_counts(result)).execute()
    if result["lane"] == FAST:
        charge_fast_seconds(account, run_s, client)


def _finish(job_id: str, result: dict, job: dict) -> dict:
    """Store the first result of this id; a later run returns it instead of its own."""
    client = redis_client()
    with client.pipeline() as pipe:
        pipe.set(done_key(job_id), json.dumps(result), nx=True, ex=cfg.result_expires)
        stored, _, earlier = pipe.delete(lease_key(job_id)).get(done_key(job_id)).execute()
    if not stored:  # two runs of one id both finished: never meant to happen, so say so
        log.warning("job %s finished again after its first result was stored", job_id)
        with client.pipeline() as pipe:
            pipe.hincrby(DUPLICATES_KEY, job_id, 1).expire(DUPLICATES_KEY, cfg.result_expires)
            pipe.execute()
        return json.loads(earlier)
    _account_for(client, result, job["account"])
    if job.get(LEADS_RUN):  # before its caller can see it: no one joins a finished run
        close_run(job_id, result)
    return result


# max_retries=None: gpulanes counts attempts itself (redeliveries included).
# CheckedTask: a message whose call, job or route breaks the schema never runs.
@app.task(bind=True, name=GENERATE_TASK, max_retries=None, base=CheckedTask)
def generate(self, job: dict, route: dict, submitted_at: float) -> dict:
    """Run one validated job (see ``tasks.api.submit``) and describe the result."""
    started_at = time.time()
    kwargs = {"job": job, "route": route, "submitted_at": submitted_at}
    attempt, earlier = _begin(self.request.id, job, route)
    if earlier is not None:  # a redelivery of a job that already finished
        return earlier
    if attempt > cfg.MAX_RETRIES + 1:  # its workers kept dying under it
        _give_up(self, kwargs, "worker_lost", JobFailed("worker lost"), attempt,
                 f"job {self.request.id} reached attempt {attempt}: its earlier runs "
                 "were lost with their workers or failed")
    lane = _lane(self, route)
    try:
        ran = _run(job, lane)
        image = save_png(cfg.ARTIFACT_DIR, self.request.id, ran.pixels)
    except Exception as exc:  # noqa: BLE001  sorted into retry or failure below
        _fail_or_retry(self, exc, attempt, kwargs)
    return _finish(self.request.id, {
        **{k: v for k, v in route.items() if k != "lane_since"},
        "job_id": self.request.id, "image": str(image), "lane": lane,
        "worker": self.request.hostname, "device": RUNTIME.device, "started_at": started_at,
        "queued_ms": round((started_at - submitted_at) * 1000, 1),
        "run_ms": round(ran.run_ms, 1), "attempts": attempt, "cached": False,
        "cold_start": ran.load_ms is not None, "load_ms": round(ran.load_ms or 0.0, 1),
        "batch_size": ran.batch_size, "batch_wait_ms": round(ran.wait_ms, 1),
        **{k: job[k] for k in ("model", "seed", "steps", "width", "height")},
    }, job)
