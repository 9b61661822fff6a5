"""The fence of a job's runs, one Lua call at a time, against the test Redis.

A run holds its job by its lease ("<worker process>#<run>#<take token>"); every
write it makes checks that it still does. These tests drive the scripts directly:
what a stale run, a woken worker or a retried call may and may not do.
"""
from __future__ import annotations

import json
import time
from types import SimpleNamespace

import pytest
import redis
from conftest import SMALL, vary

from gpu_worker.lease import Lease, renew
from routing.lanes import Route
from routing.names import JOB_TASK
from tasks.broker import handover, runs
from tasks.broker.holder import set_holder
from tasks.broker.keys import (DEAD_KEY, DEAD_TTL_S, attempts_key, done_key, held_key,
                               lane_keys, lease_key)
from tasks.broker.holder import token_of
from tasks.broker.message import JobMessage, JobRoute
from tasks.broker.publish import Fence, Pushed, Refusal, Refused, publish_copy
from tasks.jobs.schema import validate
from tasks.settings import settings
from tasks.worker.generate import generate
from tests.harness.publishing import job_message

A, B = "gpu0@h/10/1.0", "gpu1@h/20/2.0"


def _begin(job_id: str, holder: str, taken: str) -> tuple[str, str]:
    return runs.begin(job_id, holder, taken, None)


def _lease(job_id: str, holder: str, taken: str) -> Lease:
    verdict, number = _begin(job_id, holder, taken)
    assert verdict == "run"
    return Lease(job_id, int(number), runs.token(holder, int(number), taken), time.monotonic())


def _publish() -> str:
    return generate.apply_async(kwargs={"job": {}, "route": {}, "submitted_at": 0.0},
                                queue="standard").id


def test_a_retried_begin_carries_on_as_the_same_run(clean_redis):
    assert _begin("j1", A, "t1") == ("run", "1")
    assert _begin("j1", A, "t1") == ("run", "1")  # the reply of the first was lost
    assert int(clean_redis.get(attempts_key("j1"))) == 1


def test_a_copy_is_dropped_only_while_the_holders_own_message_is_recorded(clean_redis):
    _lease("j2", A, "t1")
    clean_redis.hset(held_key(A), "t1", "standard\n{}")  # A's take t1, recorded
    assert _begin("j2", B, "t2") == ("busy", "")  # A's copy comes back if A dies
    clean_redis.hset(held_key(B), "t1", "standard\n{}")  # another's record of that name
    clean_redis.hdel(held_key(A), "t1")  # A's message was put back while A ran
    assert _begin("j2", B, "t2") == ("defer", "")  # t2 may be the last copy: kept


def test_a_finished_or_dead_job_never_runs_again(clean_redis):
    clean_redis.set(done_key("j3"), json.dumps({"attempts": 1}))
    assert _begin("j3", A, "t1")[0] == "done"
    lease = _lease("j4", A, "t1")
    assert runs.give_up("j4", lease.token, lease.attempt, '{"error": "ValueError: bug"}',
                        "failures|standard")
    assert _begin("j4", B, "t2") == ("dead", '{"error": "ValueError: bug"}')  # its failure
    # a copy that comes as late as the letter is kept still finds its run counter
    assert clean_redis.ttl(attempts_key("j4")) > DEAD_TTL_S - 60 > settings.runs_kept_s


def test_a_deferred_copy_steps_aside_from_a_released_lease(clean_redis):
    """A copy kept for later (its holder ran with no record of its message) finds the
    lease released: the holder published its retry, another copy exists."""
    lease = _lease("j8", A, "t1")
    clean_redis.set(lease_key("j8"), f"released#{lease.attempt}")
    assert runs.begin("j8", B, "t9", None, deferred=True) == ("superseded", "")
    assert _begin("j8", B, "t2") == ("run", "2")  # the retry's copy runs


def test_a_deferred_copy_put_back_runs(clean_redis):
    """The deferred copy may itself be what was put back (its holder died while it waited
    for its time): the lease released by that put-back does not make it step aside,
    or the job's last copy would be dropped."""
    _lease("j10", A, "t1")
    clean_redis.set(lease_key("j10"), "released#put-back")  # lapsed, then a copy given back
    assert runs.begin("j10", B, "t9", None, deferred=True) == ("run", "2")


def test_a_give_up_retried_after_a_lost_reply_finds_its_letter(clean_redis):
    lease = _lease("j9", A, "t1")
    assert runs.give_up("j9", lease.token, lease.attempt, "{}", "failures|standard")
    clean_redis.set(lease_key("j9"), "released#put-back")  # a copy was put back meanwhile
    assert runs.give_up("j9", lease.token, lease.attempt, "{}", "failures|standard")
    assert int(clean_redis.hget("gpulanes:metrics", "failures|standard")) == 1


def test_a_stale_run_writes_nothing(clean_redis):
    old = _lease("j5", A, "t1")
    clean_redis.delete(lease_key("j5"))  # A froze: its lease lapsed
    new = _lease("j5", B, "t2")  # and a newer run began
    assert runs.finish("j5", old.token, old.attempt, {"attempts": 1, "run_ms": 5.0},
                       "acct", charge_fast=True)[:2] == ("stale", "")
    assert not runs.give_up("j5", old.token, old.attempt, "{}", "failures|fast")
    assert renew([old]) == [0] and old._lost
    assert clean_redis.get(lease_key("j5")).decode() == new.token
    assert not clean_redis.exists(done_key("j5")) and not clean_redis.hexists(DEAD_KEY, "j5")


def test_a_lapsed_lease_is_taken_again_while_no_newer_run_began(clean_redis):
    lease = _lease("j6", A, "t1")
    clean_redis.delete(lease_key("j6"))  # Redis was away: the lease lapsed
    assert renew([lease]) == [1]
    assert clean_redis.get(lease_key("j6")).decode() == lease.token
    assert runs.finish("j6", lease.token, lease.attempt, {"attempts": 1, "run_ms": 5.0},
                       "acct", charge_fast=False)[:2] == ("stored", "")
    again = runs.finish("j6", lease.token, lease.attempt, {"attempts": 1, "run_ms": 5.0},
                        "acct", charge_fast=False)  # the reply was lost: no double count
    assert again[0] == "earlier" and json.loads(again[1])["attempts"] == 1


def test_a_handed_over_lease_cannot_be_taken_back(clean_redis):
    """The retry's publish marks the lease released: the old run's keep-alive cannot
    take it again (its retry copy would find it busy and be dropped), the copy can."""
    lease = _lease("j7", A, "t1")
    fence = Fence(lease_key("j7"), attempts_key("j7"), lease.token, lease.attempt, 60)
    copy = job_message("j7")
    assert publish_copy(clean_redis, copy, fence) == Pushed()
    assert renew([lease]) == [0]
    # the same call sent again after a lost reply finds its copy where it went
    assert publish_copy(clean_redis, copy, fence) == Pushed()
    # the run publishing again (a copy of its own): refused, nothing pushed
    assert publish_copy(clean_redis, job_message("j7"), fence) == Refused(Refusal.FENCE)
    assert clean_redis.llen("standard") == 1
    assert _begin("j7", B, "t2") == ("run", "2")


def test_an_ack_drops_only_the_record_of_its_own_take(clean_redis, app):
    """The message a process holds may be held by another too (given back while it ran,
    or handed out again by an AOF that lost its last second): the first one's late ack
    drops its own record, never the other's, even under the same token."""
    _publish()
    set_holder(A)
    try:
        with app.connection_for_write() as conn:
            channel = conn.channel()
            tag = channel.basic_get("standard", no_ack=False).delivery_tag
            token = token_of(tag)
            ((key, raw),) = handover.held(clean_redis, A).values()
            clean_redis.hset(held_key(B), token, f"{key}\n{raw}")  # B holds it now
            channel.qos.ack(tag)
            assert handover.held(clean_redis, A) == {} and not token_of(tag)
    finally:
        set_holder("")
    assert handover.held(clean_redis, B) == {token: (key, raw)}
    assert clean_redis.llen("standard") == 0  # B runs it: not put back either


@pytest.mark.parametrize("ended", ["finished", "failed"])
def test_a_dead_holders_message_of_an_ended_job_is_dropped_not_put_back(clean_redis, ended):
    """Its holder died after the job's outcome was stored and before its ack: beat drops
    the record instead of putting the message back, and the job runs no more."""
    job_id = _publish()
    assert handover.take(clean_redis, A, lane_keys("standard"), "t1") is not None
    if ended == "finished":
        clean_redis.set(done_key(job_id), json.dumps({"attempts": 1}))
    else:
        clean_redis.hset(DEAD_KEY, job_id, "{}")
    assert handover.put_back_all(clean_redis, A) == 0
    assert clean_redis.llen("standard") == 0 and handover.held(clean_redis, A) == {}
    assert A not in handover.holders(clean_redis)
    assert not clean_redis.exists(lease_key(job_id))  # no copy to come: nothing marked


def test_a_hung_run_is_given_up_and_its_message_put_back(clean_redis, monkeypatch, app):
    """A run that held its job past any run's time limit without a step: its worker
    stops extending its lease, gives its message back as it came, and the run is lost if
    it wakes. The copy given back waits for the lease to lapse (deferred, not dropped),
    and the worker's channel, closed with the hung message unacked, pushes no other."""
    from gpu_worker.hooks import give_up_hung
    from gpu_worker.runtime import RUNTIME
    from tasks.errors import LeaseLost

    job_id = _publish()
    sent = clean_redis.lrange("standard", 0, -1)
    try:
        set_holder(RUNTIME.incarnation)
        with app.connection_for_write() as conn:
            tag = conn.channel().basic_get("standard", no_ack=False).delivery_tag
            vary(monkeypatch, max_job_s=5e-7)  # hung at once: 2 x MAX_JOB_S
            lease = _lease(job_id, RUNTIME.incarnation, token_of(tag))
            assert lease.overdue()
            give_up_hung(tag, lease)
            assert clean_redis.lrange("standard", 0, -1) == sent  # byte for byte
            assert handover.held(clean_redis, RUNTIME.incarnation) == {}
    finally:
        set_holder("")
    waiting = clean_redis.lrange("standard", 0, -1)
    assert [json.loads(raw).get("redelivered") for raw in waiting] == [None]  # no other copy
    assert waiting == sent
    assert _begin(job_id, B, "t2") == ("defer", "")
    with pytest.raises(LeaseLost):
        lease.check()


def test_a_run_stores_its_started_and_success_entries_in_its_own_steps(clean_redis):
    """Where the result backend is the broker's Redis, begin stores the STARTED entry
    and finish the SUCCESS entry (and announces it) in their scripts; a finish retried
    after a lost reply, or a stale one, writes no entry."""
    from tasks.broker.backend import Entry

    entry_key = "celery-task-meta-j10"
    started = Entry(entry_key, json.dumps({"status": "STARTED", "task_id": "j10"}))
    assert runs.begin("j10", A, "t1", None, started=started) == ("run", "1")
    assert json.loads(clean_redis.get(entry_key))["status"] == "STARTED"
    assert 0 < clean_redis.ttl(entry_key) <= settings.result_ttl_s
    lease = Lease("j10", 1, runs.token(A, 1, "t1"), time.monotonic())
    listener = clean_redis.pubsub()
    listener.subscribe(entry_key)
    listener.get_message(timeout=1)  # the subscription's own reply
    success = Entry(entry_key, json.dumps({"status": "SUCCESS", "task_id": "j10"}))
    assert runs.finish("j10", lease.token, 1, {"attempts": 1, "run_ms": 5.0}, "acct",
                       charge_fast=False, stored=success)[:2] == ("stored", "")
    assert json.loads(clean_redis.get(entry_key))["status"] == "SUCCESS"
    told = listener.get_message(timeout=2)
    assert told and json.loads(told["data"])["status"] == "SUCCESS"
    clean_redis.set(entry_key, "untouched")
    assert runs.finish("j10", lease.token, 1, {"attempts": 1, "run_ms": 5.0}, "acct",
                       charge_fast=False, stored=success)[0] == "earlier"
    assert runs.begin("j10", B, "t2", None, started=started)[0] == "done"
    assert clean_redis.get(entry_key) == b"untouched"


def test_a_finish_acks_its_message_in_the_same_step_unless_stale(clean_redis):
    """A run that still holds its job drops its message's record in its finish (kombu's
    ack then leaves Redis alone); a stale run's finish drops nothing, and a finish drops
    only its own process's record, never another's of the same message."""
    def took(holder: str, taken: str) -> None:
        clean_redis.hset(held_key(holder), taken, "standard\n{}")

    def holds(holder: str, taken: str) -> bool:
        return bool(clean_redis.hexists(held_key(holder), taken))

    result = {"attempts": 1, "run_ms": 5.0}
    set_holder(A)
    try:
        took(A, "t1")
        lease = _lease("j11", A, "t1")
        assert runs.finish("j11", lease.token, 1, result, "acct", charge_fast=False,
                           ack="t1")[:2] == ("stored", "")
        assert not holds(A, "t1")
        # a stale run: its lease lapsed and a newer run began
        took(A, "t3")
        old = _lease("j12", A, "t3")
        clean_redis.delete(lease_key("j12"))
        took(B, "t4")
        _lease("j12", B, "t4")
        assert runs.finish("j12", old.token, 1, result, "acct", charge_fast=False,
                           ack="t3")[0] == "stale"
        assert holds(A, "t3") and holds(B, "t4")
        # B holds the same message under the same token (an AOF that lost its last second)
        took(A, "t5")
        took(B, "t5")
        lease = _lease("j13", A, "t5")
        assert runs.finish("j13", lease.token, 1, result, "acct", charge_fast=False,
                           ack="t5")[0] == "stored"
        assert not holds(A, "t5") and holds(B, "t5")
    finally:
        set_holder("")


def test_a_revoked_job_is_not_begun(clean_redis):
    from tasks.broker.control import record_revokes

    assert record_revokes(["j11"]) == 1
    assert _begin("j11", A, "t1") == ("revoked", "")
    assert not clean_redis.exists(lease_key("j11"))
    assert _begin("j12", A, "t1") == ("run", "1")  # another job is not


def test_a_first_run_sets_its_counter_and_a_later_one_counts_on(clean_redis):
    lease = _lease("j13", A, "t1")
    assert lease.attempt == 1 and 0 < clean_redis.ttl(attempts_key("j13")) <= settings.runs_kept_s
    runs.release("j13", lease.token, lease.attempt)
    assert _lease("j13", B, "t2").attempt == 2
    assert int(clean_redis.get(attempts_key("j13"))) == 2


def test_a_take_redis_ran_after_its_caller_gave_up_is_answered_when_sent_again(
        redis_server, clean_redis, monkeypatch, app):
    """Redis frozen (SIGSTOP) as a process sends a take: the take times out (the default
    timeout), but Redis runs it once it wakes, recording the message as that process's.
    The process's next take carries the same token and is answered that message, not the
    next one: no record names a message its holder never got, and nothing is lost."""
    import os
    import signal
    import threading

    import redis

    from tasks.broker import scripts
    from tasks.broker.holder import PENDING

    first, second = _publish(), _publish()
    run, pid = scripts.run, redis_server.process.pid
    clean_redis.script_load(scripts.source("hand_over"))  # as a worker's many takes have
    thaw = threading.Timer(settings.redis_timeout_s + 0.5, os.kill, (pid, signal.SIGCONT))

    def frozen_take(client, name, *args, **kwargs):
        if name == "hand_over":
            os.kill(pid, signal.SIGSTOP)
            thaw.start()
        return run(client, name, *args, **kwargs)

    def waiting() -> list[str]:
        return [json.loads(raw)["headers"]["id"] for raw in clean_redis.lrange("standard", 0, -1)]

    set_holder(A)
    try:
        with app.connection_for_write() as conn:
            channel = conn.channel()  # connected before the freeze
            monkeypatch.setattr(scripts, "run", frozen_take)
            with pytest.raises(redis.TimeoutError):
                channel.basic_get("standard", no_ack=False)
            monkeypatch.setattr(scripts, "run", run)
            thaw.join()
            # Redis woke and ran the take: held here, under the take's own token
            ((token, (key, raw)),) = handover.held(clean_redis, A).items()
            assert json.loads(raw)["headers"]["id"] == first and PENDING.unanswered == token
            assert waiting() == [second]
            message = channel.basic_get("standard", no_ack=False)
            assert message.headers["id"] == first and token_of(message.delivery_tag) == token
            assert handover.held(clean_redis, A) == {token: (key, raw)}
            assert waiting() == [second] and not PENDING.unanswered
            channel.qos.ack(message.delivery_tag)
    finally:
        set_holder("")
        PENDING.unanswered = ""
    assert handover.held(clean_redis, A) == {} and waiting() == [second]


@pytest.mark.parametrize("stop", ["retry", "preempted"])
def test_a_copy_is_addressed_inside_its_persisted_write(clean_redis, monkeypatch, stop):
    """A run that stops (to be retried, or preempted) publishes its job's next copy; the
    copy's address is read from Redis. Redis going away just then delays the copy until
    Redis is back: the job is never failed for it (the task would store FAILURE)."""
    from celery.exceptions import Ignore, Retry

    from gpu_worker.preempt import Preempted
    from tasks.worker import generate as gen

    lease = _lease("j9", A, "t1")
    job = validate("addressed in an outage", tier="standard", **SMALL)
    message = JobMessage(job, JobRoute.of(Route(lane="standard", requested_tier="standard")),
                         time.time())
    task = SimpleNamespace(request=SimpleNamespace(
        id="j9", task=JOB_TASK, delivery_info={}, retries=0, root_id=None, parent_id=None,
        argsrepr=None, kwargsrepr=None))
    real, reads = gen.addressed, []

    def addressed(*args, **kwargs):  # the first read meets Redis away
        reads.append(1)
        if len(reads) == 1:
            raise redis.ConnectionError("Connection refused")
        return real(*args, **kwargs)

    monkeypatch.setattr(gen, "addressed", addressed)
    monkeypatch.setattr(gen.time, "sleep", lambda s: None)  # persist's pause between tries
    if stop == "retry":
        with pytest.raises(Retry):
            gen._retry(task, RuntimeError("transient"), lease, message, message.route, 0)
    else:
        progress = SimpleNamespace(paused=lambda step, steps, leaving=False: None)
        with pytest.raises(Ignore):
            gen._preempt(task, lease, message, "standard", Preempted(3, 30), progress)
    assert len(reads) == 2  # tried again, within the write
    assert clean_redis.llen("standard") == 1  # the one copy, in the shared lane
