"""An account's plan limits on its jobs in flight (``tasks.jobs.plans``), as Midjourney's:
at most ``concurrent_jobs`` of them admitted to the lanes at once (queued there or
running; ``concurrent_fast`` of them fast), and ``queued_jobs`` more waiting in the
account's own line behind them, each entering its lane as one of the account's jobs is
over. Past that, a new job is refused (:class:`tasks.errors.OverLimit`).

The publish admits or parks a job in the step that pushes it (``lua/admit.lua``), so
concurrent submits from any number of processes never pass a limit. The worker says
when an admitted job is over (:func:`over`, from Celery's signals): its place goes to
the account's next parked job in the same step (``lua/promote.lua``). Beat looks at
the accounts with parked jobs each round (:func:`sweep`): an admission whose job is
over but was never said so (its worker died first) is dropped there, so no account
waits for a lapse. An admission lapses after ``ADMISSION_LAPSE_S`` in any case.
"""
from __future__ import annotations

import contextlib
import logging
from typing import Any

import redis
from celery import signals

from routing.names import JOB_TASK_NAMES
from tasks.broker import scripts
from tasks.broker.keys import (
    DEAD_KEY,
    DUE_PREFIX,
    FAST_NEWS_PREFIX,
    HEAVIER_SCORE,
    LANE_DEPTHS_KEY,
    LIST_DEPTHS_KEY,
    PARKED_ACCOUNTS_KEY,
    PREEMPTIBLE_KEY,
    WAKE_PREFIX,
    admitted_fast_key,
    admitted_key,
    done_key,
    parked_key,
    revoked_key,
)
from tasks.broker.publish import PlanArgs
from tasks.jobs.plans import Plan

log = logging.getLogger(__name__)
#: Seconds an admission counts at most, should its job's end never be seen.
ADMISSION_LAPSE_S = 24 * 3600
#: Accounts with parked jobs beat looks at per round.
SWEEP_ACCOUNTS = 200
#: What a refused job's caller is told to wait: about one job's run.
RETRY_AFTER_S = 5.0


def plan_args(account: str, plan: Plan) -> PlanArgs:
    """The publish's condition for a job of ``account`` on ``plan``."""
    return PlanArgs(admitted_key(account), admitted_fast_key(account), parked_key(account),
                    PARKED_ACCOUNTS_KEY, f"{plan.concurrent_jobs} {plan.concurrent_fast} "
                    f"{plan.queued_jobs} {ADMISSION_LAPSE_S}")


def over(client: redis.Redis, account: str, *job_ids: str) -> int:
    """``job_ids`` of ``account`` are over: their places go to its parked jobs, first
    parked first, as far as its plan allows. Returns how many entered their lanes."""
    return int(scripts.run(
        client, "promote",
        [admitted_key(account), admitted_fast_key(account), parked_key(account),
         PARKED_ACCOUNTS_KEY, LANE_DEPTHS_KEY, LIST_DEPTHS_KEY, PREEMPTIBLE_KEY],
        [account, DUE_PREFIX, WAKE_PREFIX, FAST_NEWS_PREFIX, HEAVIER_SCORE, *job_ids]))


def ended(client: redis.Redis, job_ids: list[str]) -> list[str]:
    """Those of ``job_ids`` that are over: a result stored, revoked, or dead-lettered."""
    with client.pipeline(transaction=False) as pipe:
        for job_id in job_ids:
            pipe.exists(done_key(job_id), revoked_key(job_id))
            pipe.hexists(DEAD_KEY, job_id)
        found = pipe.execute()
    return [job_id for job_id, marks, dead in zip(job_ids, found[::2], found[1::2])
            if marks or dead]


def sweep(client: redis.Redis) -> int:
    """Beat's round: each account with parked jobs drops the admissions of jobs that are
    over and lets parked jobs in. Returns how many entered their lanes."""
    entered = 0
    for account in client.srandmember(PARKED_ACCOUNTS_KEY, SWEEP_ACCOUNTS) or ():
        account = account.decode() if isinstance(account, bytes) else account
        admitted = [m.decode() if isinstance(m, bytes) else m
                    for m in client.zrange(admitted_key(account), 0, -1)]
        entered += over(client, account, *ended(client, admitted))
    return entered


def _client() -> redis.Redis:
    from tasks.broker.app import redis_client  # the app is built on first use only

    return redis_client()


def _admitted_job(sender: Any, request: Any) -> tuple[str, str] | None:
    """(account, job id) of a job task's request counted against a plan, else None."""
    if getattr(sender, "name", None) not in JOB_TASK_NAMES or request is None:
        return None
    job = (getattr(request, "kwargs", None) or {}).get("job") or {}
    return (str(job.get("account")), request.id) if job.get("admitted") else None


def _said_over(sender: Any, request: Any) -> None:
    found = _admitted_job(sender, request)
    if found is not None:
        with contextlib.suppress(redis.RedisError):  # beat's sweep says it later
            over(_client(), *found)


@signals.task_postrun.connect(weak=False)
def _on_postrun(sender: Any = None, state: str | None = None, **_: Any) -> None:
    """A run that ended with a result (success, or failure for good) is over; one that
    retried, stepped aside or was ignored is not."""
    if state in ("SUCCESS", "FAILURE"):
        _said_over(sender, getattr(sender, "request", None))


@signals.task_revoked.connect(weak=False)
def _on_revoked(sender: Any = None, request: Any = None, **_: Any) -> None:
    """A job revoked (or past its Cancel-After) is over."""
    _said_over(sender, request)
