"""The result cache and in-flight coalescing, submit side: no round trip of their own.

A seeded job is a pure function of (model, prompt, seed, steps, width,
height): the same six give the same PNG bit for bit. ``submit()`` hashes them
(:func:`digest`) and the job's publish script (``lua/publish.lua``, its claim first:
``lua/claim.lua``), in the one round trip of the publish, either

- finds a finished result under that digest (a *hit*): the caller gets a copy
  marked ``cached: true`` that names the same PNG (artifacts are files,
  referenced, never copied or stored twice), and no GPU is touched; a PNG
  that has vanished, or whose size or sha256 no longer match the result's, is a
  miss and its entry is dropped;
- finds a run of the same digest, queued or running, whose leader's message is in
  a lane at least as fast as the caller's tier: the caller *follows* it under its
  own job id, registered in the run's hash, and the worker that closes the run
  writes the caller's result (``tasks.worker.coalesce``); a faster caller leads a
  run of its own instead, so coalescing never makes a fast job wait in a slower
  lane. The run's rank is the lane its leader was published to, not the tier it
  asked for (an account out of fast time, a full lane, sends a fast job lower), and
  it follows the leader down when a deadline move or a retry takes it lower; or
- claims the digest for the caller's job and pushes the job, which confirms
  the claim in the same step. A publish refused after its claim (a full lane)
  leaves it provisional until the job's next publish confirms it, so a claim
  whose job never reached a lane lapses by itself and no one ever waits on it.

Admission is LRU-K with K=2: a result enters the cache only when its digest
was seen before. Sightings live in a pybloom-live ``ScalableBloomFilter`` in
the *submitting process*, not in Redis: counting a one-off prompt anywhere
shared costs a key or a write per submit, which is what admission is there to
avoid, while the filter costs a few bytes per digest (two bounded
generations, see ``Sightings``) and no round trip, and it is only ever read
where it is written. The price: sightings are
counted per submitting process, so a digest seen once by each of two
processes is not admitted yet, and a false positive (rate at most
``BLOOM_ERROR``) admits a one-off early. Both only move the
moment of admission; neither can serve a wrong image. A follower's sighting
counts too: it marks the run it joins for admission.

Jobs without a seed (one is drawn at submit) are never looked up, claimed or
admitted, and pay no round trip for it.
"""
from __future__ import annotations

import contextlib
import hashlib
import json
import math
import threading
import time
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

from celery import states
from celery.result import AsyncResult, EagerResult
from pybloom_live import ScalableBloomFilter

from routing.names import JOB_TASK, LANES
from tasks.broker import scripts
from tasks.broker.app import app, redis_client
from tasks.broker.backend import store_success
from tasks.broker.keys import (
    CACHE_LRU_KEY,
    METRICS_KEY,
    RUN_KEY_PREFIX,
    cache_entry_key,
    inflight_key,
    run_key,
)
from tasks.broker.message import BOOKKEEPING, ROUTING, Job, Result
from tasks.broker.outage import OUTAGE
from tasks.broker.publish import ClaimArgs
from tasks.jobs import catalog
from tasks.jobs.artifacts import is_intact, references
from tasks.settings import settings

#: Sightings a submitting process's filter generation holds within BLOOM_ERROR, the
#: false-positive rate, before the next generation starts.
BLOOM_CAPACITY = 100_000
BLOOM_ERROR = 0.001


def provisional_s() -> int:
    """How long an unconfirmed claim lives: well past the longest a submit takes to publish."""
    return math.ceil(4 * settings.redis_timeout_s) + 10


@dataclass(frozen=True)
class RunClaim:
    """The caller leads a new run of its digest: publish its job to confirm it."""

    job_id: str
    pointer: str
    run: str


class Sightings:
    """Digests this process has seen lately (LRU-K admission, K=2), in Bloom filters.

    Two generations of ``ScalableBloomFilter``, each built for ``capacity``
    digests at half of ``error_rate``, so a lookup in both stays within
    ``error_rate``. When the newer one holds ``capacity`` digests it becomes
    the older and the oldest is dropped: memory stays bounded in a long-lived
    process, and a sighting counts for at least ``capacity`` later ones.
    """

    def __init__(self, capacity: int, error_rate: float) -> None:
        self._capacity, self._error_rate = capacity, error_rate / 2
        self._new, self._old = self._generation(), self._generation()
        self._lock = threading.Lock()  # submit() may run on many threads

    def _generation(self) -> ScalableBloomFilter:
        return ScalableBloomFilter(initial_capacity=self._capacity, error_rate=self._error_rate)

    def seen_before(self, key: str) -> bool:
        """Record a sighting of ``key``; whether it had been seen (or looks so)."""
        with self._lock:
            if len(self._new) >= self._capacity:
                self._new, self._old = self._generation(), self._new
            return self._new.add(key) or key in self._old

    def __contains__(self, key: str) -> bool:
        with self._lock:
            return key in self._new or key in self._old


@lru_cache(maxsize=1)
def sightings() -> Sightings:
    """This process's sightings."""
    return Sightings(BLOOM_CAPACITY, BLOOM_ERROR)


def digest(job: dict[str, Any]) -> str:
    """The content address of a job's output: blake2b of the canonical JSON of its
    model, the model's pinned version and its validated inputs (tier, account and
    routing do not change the output)."""
    inputs = {k: v for k, v in job.items() if k not in ROUTING and k not in BOOKKEEPING}
    addressed = {"model": job["model"], "version": catalog.spec(job["model"]).version,
                 "inputs": inputs}
    canonical = json.dumps(addressed, sort_keys=True, separators=(",", ":"),
                           ensure_ascii=False)
    return hashlib.blake2b(canonical.encode(), digest_size=16).hexdigest()


def cacheable(job: Job, given: dict[str, Any]) -> bool:
    """Whether ``job``'s output may be served to, and shared with, identical jobs: its
    model is deterministic for its inputs (a class model declaring ``deterministic``;
    an image model), and a seed among them was given (a drawn seed is never shared)."""
    found = catalog.spec(job.model)
    if found.cls is not None and not found.deterministic:
        return False
    takes_seed = found.cls is None or "seed" in found.Input.model_fields
    return not takes_seed or given.get("seed") is not None


def copy_for(result: dict[str, Any], job: dict[str, Any], job_id: str,
             **fields: Any) -> dict[str, Any]:
    """``result`` as another caller's: its job id and tier, ``cached`` (no GPU run
    of its own, ``attempts`` 0) and the job that made the image (``source_job_id``)."""
    return Result.decode(result).copied_for(job["tier"], job_id, **fields).encode()


def _claim(found: Claim, drop: bool) -> tuple[str, str]:
    """``found``'s claim in a script call of its own (``drop``: its entry first)."""
    (entry, lru, metrics), (admit, *rest) = found.publish
    return scripts.run(redis_client(), "cache_claim",
                       [entry, lru, found.run.pointer, found.run.run, metrics],
                       [found.run.job_id, admit + ("d" if drop else ""), *rest])


def _serve(cached: dict[str, Any], job: dict[str, Any], job_id: str) -> AsyncResult:
    """The hit stored under ``job_id`` (anyone holding the id can read it), and returned
    already resolved: the caller's ``.get()`` needs no further round trip."""
    result = copy_for(cached, job, job_id, queued_ms=0.0, run_ms=0.0, cold_start=False,
                      load_ms=0.0, started_at=time.time())
    store_success(app, job_id, result)
    return EagerResult(job_id, result, states.SUCCESS, name=JOB_TASK)


@dataclass(frozen=True)
class Claim:
    """A claim of a job's digest made by the job's own publish (one round trip): the
    run it would lead, and what the publish script takes (``Conditions.claim``)."""

    run: RunClaim
    publish: ClaimArgs


def claim_in_publish(job: dict[str, Any], job_id: str) -> Claim:
    """What the publish of seeded ``job`` claims (counting its digest as seen)."""
    key, now, rank = digest(job), time.time(), LANES.index(job["tier"])
    admit = sightings().seen_before(key)
    follower = json.dumps({"job": job, "submitted_at": now, "rank": rank})
    return Claim(RunClaim(job_id, inflight_key(key), run_key(job_id)),
                 ((cache_entry_key(key), CACHE_LRU_KEY, METRICS_KEY),
                  ("a" if admit else "", follower, now, rank, provisional_s(), RUN_KEY_PREFIX)))


def answered(found: Claim, verdict: str, value: str,
             job: dict[str, Any]) -> AsyncResult | RunClaim | None:
    """The caller's result when its publish found the digest taken (``verdict``: hit,
    follow or solo); a :class:`RunClaim` when a hit's artifacts are gone and the job
    leads after all (publish it to confirm); None: run alone."""
    job_id = found.run.job_id
    if verdict == "hit":
        cached = json.loads(value)
        if intact(cached):
            return _serve(cached, job, job_id)
        verdict, value = _claim(found, drop=True)  # a miss after all
    if verdict == "follow":
        return AsyncResult(job_id, app=app)
    return found.run if verdict == "lead" else None


def claim(job: dict[str, Any], job_id: str) -> AsyncResult | RunClaim | None:
    """Claim seeded ``job``'s digest in a round trip of its own (``submit()`` claims in
    the job's publish: :func:`claim_in_publish`): the caller's result from the cache or
    an identical run in flight; a :class:`RunClaim`: ``job_id`` leads a new run,
    publish it; None: an identical run is being claimed, run alone."""
    found = claim_in_publish(job, job_id)
    verdict, value = _claim(found, drop=False)
    return found.run if verdict == "lead" else answered(found, verdict, value, job)


def intact(result: dict[str, Any]) -> bool:
    """Whether every artifact a result names (its ``image``, its ``output``'s
    references) is still the one it made: same size and sha256, checked in the local
    folder or through the artifact store, whichever wrote it (a result stored before
    artifacts carried them: the artifact exists)."""
    return all(is_intact(ref) for ref in references(result))


def release(run: RunClaim) -> None:
    """Drop a claim whose job could not be published (best effort: it lapses anyway)."""
    with contextlib.suppress(*OUTAGE):
        scripts.run(redis_client(), "cache_release", [run.pointer, run.run], [run.job_id])
