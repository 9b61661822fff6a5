"""The Redis side of one run of a job: begin it, then record its outcome, fenced.

- :func:`begin` is one Lua call: a finished job answers with its result; a
  revoked job is not run; a job another run holds is left to it; otherwise the
  job's run counter goes up and the new run takes the lease
  (``gpu_worker.lease``), its number the run's fencing token.
- :func:`finish`, :func:`give_up` and :func:`release` each check, in the same
  Lua call as their writes, that the run still holds its job; a stale run (a
  newer one took over) writes nothing. So do a retry's publish
  (``tasks.broker.publish``, ``fence``) and the lease's extensions.
- Outcome writes go through ``tasks.broker.outage.persist``, tried until Redis answers:
  a worker keeps a job's outcome through an outage and records it then, never
  reports a false failure.
"""
from __future__ import annotations

import json
import logging
import time
from typing import Any, NamedTuple

from routing.names import FAIR_LANES
from tasks.broker import scripts
from tasks.broker.app import redis_client
from tasks.broker.backend import Entry
from tasks.broker.cell import share
from tasks.broker.holder import holder as process_holder
from tasks.broker.keys import (
    DEAD_INDEX_KEY,
    DEAD_KEY,
    DEAD_TTL_S,
    FAST_BALANCE_KEY,
    FAST_EXHAUSTED_KEY,
    HELD_PREFIX,
    METRICS_KEY,
    attempts_key,
    done_key,
    queued_key,
    waiting_accounts_key,
    held_key,
    lease_key,
    prediction_key,
    revoked_key,
)
from tasks.broker.publish import RELEASED
from tasks.settings import settings

log = logging.getLogger(__name__)


def _run(name: str, keys: list[str], args: list[Any]) -> Any:
    return scripts.run(redis_client(), name, keys, args)


def token(holder: str, attempt: int, taken: str) -> str:
    """The lease value of run ``attempt`` by ``holder`` of the message it took under take
    token ``taken``."""
    return f"{holder}#{attempt}#{taken}"


def begin(job_id: str, holder: str, taken: str, account: str | None,
          deferred: bool = False, started: Entry | None = None) -> tuple[str, str]:
    """(``run``, its number) | (``done``, the result JSON) | (``dead``, the dead letter)
    | (``revoked``|``busy``|``defer``|``superseded``, '').

    The job leaves ``account``'s jobs waiting in the fast and standard lanes here (its
    fast place, ``tasks.jobs.fastlimit``; its weight on the level of the account's next
    jobs, ``routing.fair.queued_level``); a run that begins stores ``started`` (its
    STARTED entry in the result backend) and logs its prediction's ``started`` event in
    the same step."""
    key, entry = started or (done_key(job_id), "")  # no entry: a key unused
    keys = [done_key(job_id), lease_key(job_id), attempts_key(job_id), revoked_key(job_id),
            DEAD_KEY, key]
    if account is not None:
        keys += [key for lane in FAIR_LANES
                 for key in (queued_key(lane, account), waiting_accounts_key(lane))]
    return tuple(_run("run_begin", keys, [holder, settings.lease_ttl_s, settings.runs_kept_s,
                                          job_id, taken, "1" if deferred else "", RELEASED,
                                          entry, settings.result_ttl_s, HELD_PREFIX,
                                          account or "", prediction_key(job_id)]))


class Finished(NamedTuple):
    """What a run's finish did: ``stored``|``stale`` ('' as value) or ``earlier`` (the
    result stored before as value); the followers of the run it settled, as (job id,
    their entry JSON)."""

    verdict: str
    value: str
    followers: tuple[tuple[str, str], ...] = ()


def finish(job_id: str, token: str, attempt: int, result: dict[str, Any], account: str,
           charge_fast: bool, stored: Entry | None = None, ack: str = "",
           settle: tuple[list[str], list[Any]] | None = None) -> Finished:
    """Store ``result`` as the job's and (``charge_fast``) charge ``account`` its fast
    seconds, if the run still holds the job, and store and announce ``stored`` (its
    SUCCESS entry in the result backend) in the same step. ``ack``: the take token of
    the run's message, whose record goes in that step too unless the run is stale (its
    ack then leaves Redis alone). ``settle``: the keys
    and arguments of closing the coalesced run the job leads (``lua/settle.lua``), done
    in that step too unless the run is stale, before its entry is announced."""
    key, entry = stored or (done_key(job_id), "")
    keys = [lease_key(job_id), attempts_key(job_id), done_key(job_id), key, FAST_BALANCE_KEY,
            FAST_EXHAUSTED_KEY, held_key(process_holder()), prediction_key(job_id)]
    args = [token, attempt, json.dumps(result), settings.result_ttl_s, account,
            repr(result["run_ms"] / 1000),
            repr(share(settings.fast_seconds_default)) if charge_fast else "", entry, ack,
            settings.lease_ttl_s]
    if settle is not None:
        keys, args = keys + settle[0], args + settle[1]
    verdict, value, *flat = _run("run_finish", keys, args)
    return Finished(verdict, value, tuple(zip(flat[::2], flat[1::2])))


def failed_at(entry: str | bytes) -> float:
    """When a dead letter says its job failed (its score in ``DEAD_INDEX_KEY``); now
    when it does not say (retention then counts from its indexing)."""
    try:
        return float(json.loads(entry)["failed_at"])
    except (ValueError, KeyError, TypeError):
        return time.time()


def give_up(job_id: str, token: str, attempt: int, entry: str, failures_field: str,
            failed: Entry | None = None) -> bool:
    """Dead-letter the job (``entry``) if the run still holds it, storing ``failed`` (its
    FAILURE entry in the result backend) in the same step; False: stale."""
    keys = [lease_key(job_id), attempts_key(job_id), DEAD_KEY, METRICS_KEY, DEAD_INDEX_KEY,
            prediction_key(job_id)]
    args = [token, attempt, job_id, entry, failures_field, repr(failed_at(entry)),
            max(DEAD_TTL_S, settings.runs_kept_s)]
    if failed is not None:
        keys, args = [*keys, failed.key], [*args, failed.value, settings.result_ttl_s]
    return bool(_run("run_give_up", keys, args))


def release(job_id: str, token: str, attempt: int, fast_charge: tuple[str, float] | None = None
            ) -> None:
    """Drop the run's lease if it still holds it; ``fast_charge``: (account, seconds) of
    fast time the run used, charged in the same step (a fast job revoked mid-run)."""
    keys, args = [lease_key(job_id), attempts_key(job_id)], [token, attempt]
    if fast_charge:
        keys += [FAST_BALANCE_KEY, FAST_EXHAUSTED_KEY]
        args += [fast_charge[0], repr(fast_charge[1]),
                 repr(share(settings.fast_seconds_default))]
    _run("run_release", keys, args)
