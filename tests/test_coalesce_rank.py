"""A coalesced run is joined only from lanes as slow as its leader's, and closed once.

No worker runs here: runs are claimed and published as ``submit()`` does, moved
as beat and a worker's retry move them, and settled as a worker settles them,
on the session Redis.
"""
from __future__ import annotations

import time
import uuid
from collections import Counter

from celery import signals
from celery.result import AsyncResult
from conftest import SMALL, scripts_called, vary

import tasks.broker.enqueue as enqueue_module
import tasks.worker.coalesce as coalesce
from beat.movers import enforce_deadlines
from routing.names import JOB_TASK, LANES
from routing.policy import PolicyView
from tasks import submit
from tasks.broker.app import app
from tasks.broker.enqueue import enqueue
from tasks.broker.keys import attempts_key, lane_keys, lease_key, run_key
from tasks.broker.message import Job
from tasks.broker.publish import Fence, Pushed, publish_copy
from tests.harness.publishing import job_message
from tasks.errors import JobFailed
from tasks.jobs.cache import RunClaim, claim
from tasks.worker.generate import generate


def _job(tier: str, account: str = "acct", downgradable: bool = False) -> dict:
    """A seeded job as its message carries it (all alike but for tier and account)."""
    return {"prompt": "ranked", "tier": tier, "account": account, "model": "demo",
            "seed": 1, "downgradable": downgradable, **SMALL}


def _lead(job: dict, **kwargs) -> str:
    """Claim and publish ``job`` as a new run's leader, as ``submit()`` does."""
    job_id = str(uuid.uuid4())
    run = claim(job, job_id)
    assert isinstance(run, RunClaim)
    enqueue(Job.decode(job).leading(), job_id, run=(run.pointer, run.run), **kwargs)
    return job_id


def _follows(job: dict) -> bool:
    """Whether a caller of ``job`` joins a run in flight (a faster one leads its own)."""
    return isinstance(claim(job, str(uuid.uuid4())), AsyncResult)


def _depths(client) -> list[int]:
    return [sum(client.llen(key) for key in lane_keys(lane)) for lane in LANES]


def _rank(client, leader: str) -> int:
    return int(client.hget(run_key(leader), "rank"))


def test_a_run_sent_below_its_tier_is_joined_from_that_lane_only(clean_redis, monkeypatch):
    # the account's fast time is spent: its fast job waits in relaxed
    monkeypatch.setattr(enqueue_module, "TIER_LANES_ONLY",
                        PolicyView(exhausted=frozenset({"spent"})))
    leader = _lead(_job("fast", account="spent"))
    assert _depths(clean_redis) == [0, 0, 1] and _rank(clean_redis, leader) == 2
    assert _follows(_job("relaxed", account="rich"))
    fast = claim(_job("fast", account="rich"), "rich-fast")
    assert isinstance(fast, RunClaim)  # leads a run of its own, in its own lane


def test_a_leader_moved_down_by_its_deadline_takes_its_run_down(clean_redis):
    leader = _lead(_job("fast", downgradable=True), submitted_at=time.time() - 60)
    assert _rank(clean_redis, leader) == 0
    assert enforce_deadlines(clean_redis, {"fast": 10.0, "standard": 600.0})["fast"] == 1
    assert _depths(clean_redis) == [0, 1, 0] and _rank(clean_redis, leader) == 1
    assert _follows(_job("standard"))
    assert isinstance(claim(_job("fast"), "later-fast"), RunClaim)


def _retry(client, job_id: str, job: dict, lane: str) -> None:
    """Publish a job's next copy to ``lane``, fenced, as a worker's retry does."""
    token = f"worker#1#tag-{job_id}"
    client.set(lease_key(job_id), token)  # the run holds its lease while it retries
    copy = job_message(job_id, lane, {"job": job, "route": {"lane": lane,
                                                           "requested_tier": job["tier"]},
                                      "submitted_at": time.time()})
    fence = Fence(lease_key(job_id), attempts_key(job_id), token, 1, 60)
    assert publish_copy(client, copy, fence) == Pushed()


def test_a_retry_down_a_lane_takes_its_run_down(clean_redis):
    job = _job("fast")
    leader = _lead(job)
    clean_redis.delete(*lane_keys("fast"))  # a worker took it; its run failed and retries lower
    _retry(clean_redis, leader, {**job, "leads_run": True}, "relaxed")
    assert _depths(clean_redis) == [0, 0, 1] and _rank(clean_redis, leader) == 2
    assert _follows(_job("relaxed"))
    assert isinstance(claim(_job("standard"), "later-standard"), RunClaim)
    _retry(clean_redis, "no-run", _job("standard"), "relaxed")  # a job leading no run: none is made
    assert not clean_redis.exists(run_key("no-run"))


def test_an_heir_sent_below_its_tier_takes_the_run_there(clean_redis, monkeypatch):
    leader = _lead(_job("standard", downgradable=True))
    clean_redis.delete(*lane_keys("standard"))  # revoked before it ran
    assert _follows(_job("standard", downgradable=True)) and _follows(_job("relaxed"))
    monkeypatch.setattr(enqueue_module, "TIER_LANES_ONLY",
                        PolicyView(overloaded=frozenset({"standard"})))
    publish = coalesce.enqueue

    def publish_heir(*args, **kwargs):
        assert claim(_job("relaxed"), "too-early") is None  # not joinable before it lands
        return publish(*args, **kwargs)

    monkeypatch.setattr(coalesce, "enqueue", publish_heir)
    heir = coalesce.promote(leader)
    assert _depths(clean_redis) == [0, 0, 1] and _rank(clean_redis, heir) == 2
    assert _follows(_job("relaxed"))
    assert isinstance(claim(_job("standard"), "later-standard"), RunClaim)


def test_followers_of_a_failed_run_are_failed_once(clean_redis, monkeypatch):
    job = _job("fast")
    leader = _lead(job)
    followers = [r.id for r in (claim(_job(t), str(uuid.uuid4())) for t in ("fast", "relaxed"))]
    writes, mark = Counter(), app.backend.mark_as_failure

    def counted(job_id, exc, *args, **kwargs):
        writes[job_id] += 1
        return mark(job_id, exc, *args, **kwargs)

    monkeypatch.setattr(app.backend, "mark_as_failure", counted)
    what = f"job {leader} failed on attempt 1: ValueError: simulated bug"
    assert coalesce.fail_followers(leader, what) == 2  # the task's own give-up...
    # ...then Celery's task_failure signal for the JobFailed it raised
    signals.task_failure.send(sender=generate, task_id=leader, exception=JobFailed(what),
                              kwargs={"job": {**job, "leads_run": True}})
    assert writes == Counter({job_id: 1 for job_id in followers})
    assert all(AsyncResult(job_id, app=app).state == "FAILURE" for job_id in followers)
    # the same settle tried again after its reply was lost still names them
    assert coalesce.fail_followers(leader, what) == 2


def test_a_seeded_submit_claims_in_its_own_publish(clean_redis, monkeypatch):
    """One script call a seeded submit: the publish claims the digest and pushes the job
    that leads (confirmed); an identical submit is answered in its publish and pushes
    nothing; a leader refused by a full lane after its claim confirms it below."""
    vary(monkeypatch, cache=True, max_depth={"standard": 1})  # no worker here: lanes hold
    called = scripts_called(monkeypatch)
    leader = submit("claimed in the publish", tier="standard", seed=61, **SMALL)
    assert called == ["publish"]
    run = clean_redis.hgetall(run_key(leader.id))
    assert run[b"confirmed"] == b"1" and run[b"rank"] == b"1"
    follower = submit("claimed in the publish", tier="standard", seed=61, **SMALL)
    assert called == ["publish", "publish"]  # answered in the publish: follow, nothing pushed
    assert follower.id != leader.id and clean_redis.hexists(run_key(leader.id),
                                                            f"f:{follower.id}")
    # standard holds its one job now: the next leader's claim is made, its push refused,
    # and its publish to relaxed confirms the claim
    spilled = submit("full lane", tier="standard", seed=62, **SMALL)
    run = clean_redis.hgetall(run_key(spilled.id))
    assert run[b"confirmed"] == b"1" and run[b"rank"] == b"2"
    assert [sum(clean_redis.llen(k) for k in lane_keys(lane)) for lane in LANES] == [0, 1, 1]
