"""The job task (``routing.names.JOB_TASK``): run one job on this worker's warm model.

A job id has one result, however often its message is delivered. The runs of
a job are numbered; the run that begins holds the job's lease
(``gpu_worker.lease``) and every write it makes is fenced by its number
(``tasks.broker.runs``):

- a copy that finds the lease taken steps aside (``Ignore``: acked, no state
  written), and a copy of a finished job returns its result;
- a run that a newer one took over while it was frozen or cut off from Redis
  stops at its next step and writes nothing;
- a revoked job never runs, and a running one stops at its next step (a fast one
  charged only the seconds it ran); one that leads a coalesced run others still
  wait for runs on for them;
- a run preempted for a fast job steps aside at a step boundary
  (``gpu_worker.preempt``): its next copy goes to the front of its lane;
- a failure of the worker's own (disk, device) sends the job back to its shared
  lane without spending its retries, for another worker once this one steps
  aside (``gpu_worker.health``); a store that refuses a finished run's artifacts is
  waited out, the output kept in memory (``tasks.worker.saving``); another transient
  failure retries one lane down after a backoff; anything else, or too many
  tries, dead-letters it;
- outcomes are recorded through Redis outages (``tasks.broker.outage.persist``): a
  caller never sees a false failure, and nothing is charged twice.
"""
from __future__ import annotations

import json
import logging
import os
import sys
import time
from typing import Any, NoReturn

from celery import states
from celery.exceptions import Ignore, Reject, Retry

import tasks.jobs.fastlimit  # noqa: F401  its handler frees a revoked job's place
import tasks.jobs.admission  # noqa: F401  its handlers say when a plan's job is over
from gpu_worker import hooks
from gpu_worker.batching import Ran
from gpu_worker.health import HEALTH, is_worker_fault
from gpu_worker.hooks import HELD_JOBS
from gpu_worker.lease import Lease
from gpu_worker.preempt import PREEMPTION, SUSPENDED, Preempted
from gpu_worker.runtime import RUNTIME
from routing.names import FAST, JOB_TASK, JOB_TASK_ALIASES, lane_of, worker_queue
from routing.policy import next_lane
from tasks.broker import runs
from tasks.broker.app import app, redis_client
from tasks.broker.backend import stored_by_run
from tasks.broker.holder import acked_with_run, token_of
from tasks.broker.keys import DUPLICATES_KEY, METRICS_KEY, attempts_key, lease_key, metric_field
from tasks.broker.message import Job, JobMessage, JobRoute, Result
from tasks.broker.outage import persist
from tasks.broker.enqueue import addressed
from tasks.broker.publish import Fence, Message, Pushed, envelope_of, publish, publish_copy
from tasks.errors import JobFailed, JobRevoked, LeaseLost, WorkerStopping
from tasks.jobs.retry import backoff_s, is_transient
from tasks.jobs.usage import COUNTS, job_counts
from tasks.settings import RETRY_BASE_S, RETRY_CAP_S, SICK_AFTER, settings
from tasks.worker import handoff
from tasks.worker.coalesce import deliver, followers_of, settle_call
from tasks.worker.endings import (RUN_ENTRIES, STALE_FIELD, give_up, run_entry, run_lane,
                                  stop_revoked, stop_stale)
from tasks.worker.execute import kept, run_job
from tasks.worker.progress import Progress
from tasks.worker.rejects import CheckedTask
from tasks.worker.revokes import NamedRevokeRequest, tell_revoked
from tasks.worker.steps import StepGuard

__all__ = ["ALIASES", "STALE_FIELD", "TASK_OPTIONS", "generate"]
log = logging.getLogger(__name__)
hooks.install()  # this module loads in workers (and beat) only: wire their hooks


def _begin(task: Any, message: JobMessage) -> Lease | dict:
    """Begin a run: its lease, or the result a finished run stored; else ``Ignore``."""
    job_id, route = task.request.id, message.route
    taken = _take_token(task)

    def call() -> tuple[float, tuple[str, str]]:
        sent_at = time.monotonic()
        return sent_at, runs.begin(job_id, RUNTIME.incarnation, taken, message.job.account,
                                   deferred=route.deferred, started=started)

    started = run_entry(task, {"pid": os.getpid(), "hostname": task.request.hostname},
                     states.STARTED)

    sent_at, (verdict, value) = persist(call, f"the start of job {job_id}")
    if verdict == "done":  # a redelivery of a job that already finished
        return json.loads(value)
    if verdict == "dead":  # it failed for good: this copy is a leftover; its caller
        letter = json.loads(value)  # hears the failure (again, or for the first time)
        raise JobFailed(f"job {job_id} failed for good: {letter.get('error')}")
    if verdict in ("busy", "superseded"):  # another run holds it, with its own message,
        raise Ignore()                      # or another copy exists: this one steps aside
    if verdict == "defer":
        _defer(task, message)
    if verdict == "revoked":
        stop_revoked(task, None)
    lease = Lease(job_id, int(value), runs.token(RUNTIME.incarnation, int(value), taken),
                  sent_at)
    HELD_JOBS.attach(lease)
    return lease


def _delivery_tag(task: Any) -> str:
    """The delivery tag of the message the task runs from ('' : none)."""
    return (task.request.properties or {}).get("delivery_tag") or ""


def _take_token(task: Any) -> str:
    """The take token of the message the task runs from: its record's name ('' : none)."""
    return token_of(_delivery_tag(task))


def _defer(task: Any, message: JobMessage) -> NoReturn:
    """Another run holds the job but its own message is no longer recorded (put back
    while it ran): this copy may be the job's last, so it comes back later instead of
    being dropped; by then the job is done, or its lease lapsed and this copy runs."""
    persist(lambda: publish(redis_client(), _next_copy(
        task, message.with_route(message.route.deferred_copy()), 2 * settings.lease_ttl_s,
        task.request.retries)), f"a later copy of job {task.request.id}")
    log.info("job %s runs elsewhere with no record of its message: this copy comes back "
             "in %ss", task.request.id, 2 * settings.lease_ttl_s)
    raise Ignore()


def _next_copy(task: Any, message: JobMessage, countdown: float, retries: int,
               queue: str | None = None) -> Message:
    """The job's next copy (``message``) under the name it ran by, in ``queue`` (default: its
    route's shared lane) at this copy's priority, after ``countdown``; addressed from
    Redis: made in the write ``persist`` tries."""
    request, queue = task.request, queue or lane_of(message.route.lane)
    sent = envelope_of(app, request.id, request.task, message.kwargs(), queue,
                       _priority(task), countdown=countdown, retries=retries,
                       root_id=request.root_id, parent_id=request.parent_id,
                       argsrepr=getattr(request, "argsrepr", None),
                       kwargsrepr=getattr(request, "kwargsrepr", None))
    return addressed(queue, sent, message.lane_clock)


def _priority(task: Any) -> int:  # the priority step this run's message was taken at
    return (task.request.delivery_info or {}).get("priority") or 0


def _fence(task: Any, lease: Lease) -> Fence:
    """The condition of a publish only the run still holding the job may make."""
    return Fence(lease_key(task.request.id), attempts_key(task.request.id), lease.token,
                 lease.attempt, settings.runs_kept_s)


def _retry(task: Any, exc: Exception, lease: Lease, message: JobMessage, route: JobRoute,
           countdown: float) -> NoReturn:
    """Publish the job's next copy to ``route``'s shared lane, fenced: only a run that
    still holds the job may, and the same step marks its lease released (this run can
    never take it again; the next copy begins as if it were free)."""
    verdict = persist(lambda: publish_copy(redis_client(), _next_copy(
        task, message.with_route(route), countdown, task.request.retries + 1),
        _fence(task, lease)), f"the retry of job {task.request.id}")
    if verdict != Pushed():  # the fence: a newer run holds the job (or an earlier try of
        stop_stale(task, lease)  # this very publish went through, its reply lost)
    retries = metric_field("retries", run_lane(task, message.route))
    persist(lambda: redis_client().hincrby(METRICS_KEY, retries, 1), "a retry's count")
    raise Retry(exc=exc, when=countdown)


def _fail_or_retry(task: Any, exc: Exception, lease: Lease, message: JobMessage,
                   guard: StepGuard) -> NoReturn:
    """Sort a stopped run: stale, revoked, preempted, the worker's fault, transient, or
    failed for good."""
    if isinstance(exc, WorkerStopping):  # nothing to record: Redis is away
        raise exc
    if isinstance(exc, LeaseLost):
        stop_stale(task, lease)
    if isinstance(exc, JobRevoked):  # a fast job pays the seconds its model ran
        stop_revoked(task, lease, guard, (message.job.account, time.monotonic() - guard.began)
                 if guard.lane == FAST else None)
    if isinstance(exc, Preempted):
        _preempt(task, lease, message, guard.lane, exc, guard.report)
    HEALTH.failed(exc)
    route, attempt = message.route, lease.attempt
    what = f"job {task.request.id} failed on attempt {attempt}: {type(exc).__name__}: {exc}"
    faults = route.worker_faults
    tries = attempt - faults - route.preempted  # runs lost to workers or preempted: no tries
    if is_worker_fault(exc) and faults < SICK_AFTER + settings.max_retries:
        # back to its shared lane, at once: another worker takes it, surely once this
        # one steps aside (SICK_AFTER faults in a row)
        log.warning("%s; this worker's fault: the job goes back to its lane", what)
        _retry(task, exc, lease, message, route.back_to_shared(time.time()), 0)
    if is_worker_fault(exc):
        give_up(task, message, lease, "worker_faults", exc,
                 f"{what} (gave up after {faults + 1} workers failed it)")
    if not is_transient(exc):
        give_up(task, message, lease, "error", exc, what)
    if tries > settings.max_retries:
        give_up(task, message, lease, "retries_exhausted", exc,
                 f"{what} (gave up after {attempt} attempts)")
    torch = sys.modules.get("torch")
    if torch is not None and torch.cuda.is_available():
        torch.cuda.empty_cache()  # hand fragmented cache back before the retry
    lane = next_lane(route.lane) or route.lane
    countdown = max(backoff_s(tries, RETRY_BASE_S, RETRY_CAP_S),
                    getattr(exc, "retry_after_s", 0.0))
    log.warning("%s; retrying in %s in %.2fs", what, lane, countdown)
    # its wait in the new lane starts once the backoff is over
    _retry(task, exc, lease, message, route.retried(lane, time.time() + countdown), countdown)


def _preempt(task: Any, lease: Lease, message: JobMessage, lane: str, stop: Preempted,
             progress: Progress) -> NoReturn:
    """Step aside for a waiting fast (or lighter) job: its next copy goes to the front of
    its lane at its own level, fenced like a retry (and no try of the job). A model that
    resumes leaves its state here and its copy in this worker's own queue: the worker
    runs the lighter jobs, then picks this one up where it stopped. A worker that is
    stopping (``stop.leaving``) hands the job on: its copy to the front of the shared
    lane, a resumable model's state through the store (``tasks.worker.handoff``)."""
    job_id = task.request.id
    resume = handoff.hand_over(job_id, lease.attempt, *stop.state) \
        if stop.leaving and stop.state is not None else None
    resumes = stop.state is not None and not stop.leaving
    queue = worker_queue(lane, RUNTIME.hostname) if resumes else lane
    if resumes:
        SUSPENDED.keep(job_id, *stop.state)
    progress.paused(stop.step, stop.steps, stop.leaving)  # before the copy: never after its end
    verdict = persist(lambda: publish_copy(redis_client(), _next_copy(
        task, message.with_route(message.route.preempted_copy(resume)), 0,
        task.request.retries, queue=queue), _fence(task, lease), front=True),
        f"the preempted copy of job {job_id}")
    if verdict != Pushed():
        SUSPENDED.take(job_id)
        stop_stale(task, lease)
    if stop.leaving:
        log.info("job %s stepped aside at step %d: this worker is stopping (%s)", job_id,
                 stop.step, "it resumes there elsewhere" if resume else "it starts again")
        raise Ignore()
    field = metric_field("preemptions", lane)
    persist(lambda: redis_client().hincrby(METRICS_KEY, field, 1), "a preemption's count")
    log.info("job %s stepped aside at step %d for a waiting fast job (%s)", job_id, stop.step,
             "resumes here" if resumes else "starts again")
    raise Ignore()


def _finish(task: Any, lease: Lease, result: dict, job: Job, entry: bool) -> dict:
    """Record the run's result (fenced and charged in one step, with its SUCCESS entry
    where ``entry``) and return the job's result: this one, or the one recorded first."""
    job_id = task.request.id
    stored = run_entry(task, result, states.SUCCESS) if entry else None
    # its message is acked in the same step where the entry is: nothing to put back after
    ack = _take_token(task) if stored else ""
    # a run others joined is closed to joiners in that step too, before it is announced
    settle = settle_call(job_id) if job.leads_run else None
    finished = persist(
        lambda: runs.finish(job_id, lease.token, lease.attempt, result, job.account,
                            result["lane"] == FAST, stored=stored, ack=ack, settle=settle),
        f"the result of job {job_id}")
    verdict, value = finished.verdict, finished.value
    if verdict == "stale":
        stop_stale(task, lease)
    if ack:  # its record went with the result
        acked_with_run(_delivery_tag(task))
    if verdict == "stored":
        COUNTS.add(job_counts(result, job.account))  # pushed with the worker's stats
    if stored is not None:  # stored by this run's script, or by the earlier one's
        stored_by_run(job_id)
    recorded = result if verdict == "stored" else json.loads(value)
    if recorded.get("attempts") != lease.attempt:  # another run finished first: never meant
        log.warning("job %s finished again after its first result was stored", job_id)
        persist(lambda: redis_client().pipeline().hincrby(DUPLICATES_KEY, job_id, 1)
                .expire(DUPLICATES_KEY, settings.result_ttl_s).execute(), "a duplicate")
        return recorded
    HEALTH.succeeded()
    if job.leads_run:
        followers = followers_of(finished.followers)
        persist(lambda: deliver(followers, recorded), f"the followers of job {job_id}")
    return recorded


#: The job task's options. max_retries=None: gpulanes counts attempts itself
#: (redeliveries included); CheckedTask: a message whose call, job or route breaks the
#: schema never runs; NamedRevokeRequest: a job revoked while queued is named in Flower.
TASK_OPTIONS: dict[str, Any] = dict(bind=True, max_retries=None, base=CheckedTask,
                                    track_started=not RUN_ENTRIES,
                                    Request=NamedRevokeRequest)


def _run_job(self: Any, job: dict, route: dict, submitted_at: float) -> dict:
    """Run one job (see ``tasks.api.submit``) and describe the result."""
    try:
        return _generate(self, job, route, submitted_at)
    except WorkerStopping as exc:  # Redis away as the worker stops: back to its lane
        log.warning("job %s: %s; it goes back to its lane", self.request.id, exc)
        # Redis answers: the message goes back now; else its records stay in Redis and
        # beat puts it back once this process is gone (an ack could drop them)
        raise Reject(exc, requeue=True) from exc


#: The task that runs a job, of any model (``JOB_TASK``).
generate = app.task(name=JOB_TASK, **TASK_OPTIONS)(_run_job)
#: The same task under its earlier names: a message queued under one still runs.
ALIASES = [app.task(name=name, **TASK_OPTIONS)(_run_job) for name in JOB_TASK_ALIASES]


def _generate(self: Any, job: dict, route: dict, submitted_at: float) -> dict:
    started_at = time.time()
    message = self.checked({"job": job, "route": route, "submitted_at": submitted_at})
    if isinstance(message, dict):  # a broken copy of a job that already finished
        return message
    lease = _begin(self, message)
    if isinstance(lease, dict):  # a redelivery of a job that already finished
        return lease
    route = message.route
    if lease.attempt > settings.max_retries + 1 + route.worker_faults + route.preempted:
        give_up(self, message, lease, "worker_lost", JobFailed("worker lost"),
                 f"job {self.request.id} reached attempt {lease.attempt}: its earlier runs "
                 "were lost with their workers or failed")
    lane = run_lane(self, route)
    PREEMPTION.run_begins()
    resume = SUSPENDED.take(self.request.id)  # a preempted job's state, left here
    if resume is None and route.resume:  # ... or handed over by a worker that stopped
        resume = handoff.taken_up(self.request.id, route.resume, RUNTIME.device)
    if resume is not None:
        log.info("job %s resumes at step %d, where it stepped aside", self.request.id,
                 resume[0])
    guard = StepGuard(self.request.id, lease, lane, route.preempted,
                      Progress(self, lane, route.preempted, resume[0] if resume else 0),
                      message.job.leads_run, _priority(self))
    try:
        ran = run_job(message.job, lane, guard, resume)
        lease.check()  # a stale run writes no artifact
        made = kept(self.request.id, lease, ran, started_at)  # waits out a full store
    except Exception as exc:  # noqa: BLE001  sorted into retry or failure below
        _fail_or_retry(self, exc, lease, message, guard)
    # a run its caller revoked (it went on for others) leaves its entry to the revoke
    recorded = _finish(self, lease, _result(self, message, lane, started_at, lease, ran,
                                            made), message.job, not guard.for_followers)
    if guard.for_followers:  # its own caller revoked it: the run went on for the others
        app.backend.mark_as_revoked(self.request.id, "revoked; its run went on for others")
        tell_revoked(self)
        raise Ignore()
    return recorded


def _result(task: Any, message: JobMessage, lane: str, started_at: float, lease: Lease,
            ran: Ran, made: dict[str, Any]) -> dict:
    """What the job's caller gets: what the run made (an image model's PNG and its
    parameters, or the model's output), and where and how it ran."""
    inputs = message.job.inputs if "image" in made else {}
    return Result(
        **{**message.route.reported(), "lane": lane}, **made,
        **{k: inputs[k] for k in ("seed", "steps", "width", "height") if k in inputs},
        job_id=task.request.id, model=message.job.model, worker=task.request.hostname,
        device=RUNTIME.device, started_at=started_at,
        queued_ms=round((started_at - message.submitted_at) * 1000, 1),
        run_ms=round(ran.run_ms, 1), attempts=lease.attempt, cached=False,
        cold_start=ran.load_ms is not None, load_ms=round(ran.load_ms or 0.0, 1),
        batch_size=ran.batch_size, batch_wait_ms=round(ran.wait_ms, 1),
    ).encode()
