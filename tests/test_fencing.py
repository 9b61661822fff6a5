"""The fence of a job's runs, one Lua call at a time, against the test Redis.

A run holds its job by its lease ("<worker process>#<run>#<delivery tag>"); every
write it makes checks that it still does. These tests drive the scripts directly:
what a stale run, a woken worker or a retried call may and may not do.
"""
from __future__ import annotations

import json
import time

from conftest import vary

import celeryconfig as cfg
from gpu_worker.lease import Lease, renew
from tasks.broker import runs
from tasks.broker.keys import (DEAD_KEY, DEAD_TTL_S, HOLDERS_KEY, attempts_key, done_key,
                               lease_key)
from tasks.broker.publish import PublishRefused, publishing
from tasks.broker.holder import set_holder
from tasks.broker.transport import Connection, put_back_held
from tasks.settings import settings
from tasks.worker.generate import generate

A, B = "gpu0@h/10/1.0", "gpu1@h/20/2.0"


def _begin(job_id: str, holder: str, tag: str) -> tuple[str, str]:
    return runs.begin(job_id, holder, tag, None)


def _lease(job_id: str, holder: str, tag: str) -> Lease:
    verdict, number = _begin(job_id, holder, tag)
    assert verdict == "run"
    return Lease(job_id, int(number), runs.token(holder, int(number), tag), time.monotonic())


def test_a_retried_begin_carries_on_as_the_same_run(clean_redis):
    assert _begin("j1", A, "t1") == ("run", "1")
    assert _begin("j1", A, "t1") == ("run", "1")  # the reply of the first was lost
    assert int(clean_redis.get(attempts_key("j1"))) == 1


def test_a_copy_is_dropped_only_while_the_holders_own_message_is_recorded(clean_redis):
    _lease("j2", A, "t1")
    clean_redis.hset(HOLDERS_KEY, "t1", A)  # A's take of t1, recorded
    assert _begin("j2", B, "t2") == ("busy", "")  # A's copy comes back if A dies
    clean_redis.hdel(HOLDERS_KEY, "t1")  # A's message was put back while A ran
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
    assert renew([old], tags=()) == [0] and old._lost
    assert clean_redis.get(lease_key("j5")).decode() == new.token
    assert not clean_redis.exists(done_key("j5")) and not clean_redis.hexists(DEAD_KEY, "j5")


def test_a_lapsed_lease_is_taken_again_while_no_newer_run_began(clean_redis):
    lease = _lease("j6", A, "t1")
    clean_redis.delete(lease_key("j6"))  # Redis was away: the lease lapsed
    assert renew([lease], tags=()) == [1]
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
    fence = (lease_key("j7"), attempts_key("j7"), lease.token, lease.attempt, 60)
    with publishing(fence=fence):
        generate.apply_async(kwargs={"job": {}, "route": {}, "submitted_at": 0.0},
                             task_id="j7", queue="standard")
    assert renew([lease], tags=()) == [0]
    try:  # the same publish tried again after a lost reply: refused, nothing pushed
        with publishing(fence=fence):
            generate.apply_async(kwargs={"job": {}, "route": {}, "submitted_at": 0.0},
                                 task_id="j7", queue="standard")
        raise AssertionError("a second copy was published")
    except PublishRefused as refused:
        assert refused.why == "fence"
    assert clean_redis.llen("standard") == 1
    assert _begin("j7", B, "t2") == ("run", "2")


def test_an_ack_drops_only_the_records_of_its_own_take(clean_redis):
    """An AOF that lost its last second can hand the same tag to another worker: the
    first worker's late ack must not erase the second's record."""
    generate.apply_async(kwargs={"job": {}, "route": {}, "submitted_at": 0.0},
                         queue="standard")
    try:
        with Connection(settings.broker_url, transport_options=cfg.broker_transport_options) as c:
            set_holder(A)
            channel = c.channel()
            tag = channel.basic_get("standard", no_ack=False).delivery_tag
            clean_redis.hset(HOLDERS_KEY, tag, B)  # B holds the same tag now
            channel.qos.ack(tag)
            assert clean_redis.hexists("unacked", tag) and clean_redis.hget(HOLDERS_KEY, tag)
            clean_redis.hset(HOLDERS_KEY, tag, A)  # its own take: the ack drops it
            channel.qos.ack(tag)
            assert not clean_redis.hexists("unacked", tag)
            assert not clean_redis.hexists(HOLDERS_KEY, tag)
    finally:
        set_holder("")


def test_a_dead_holders_message_of_a_failed_job_is_dropped_not_put_back(clean_redis):
    job_id = generate.apply_async(kwargs={"job": {}, "route": {}, "submitted_at": 0.0},
                                  queue="standard").id
    with Connection(settings.broker_url, transport_options=cfg.broker_transport_options) as c, \
            Connection(settings.broker_url, transport_options=cfg.broker_transport_options) as beat:
        tag = c.channel().basic_get("standard", no_ack=False).delivery_tag
        clean_redis.hset(HOLDERS_KEY, tag, A)
        clean_redis.hset(DEAD_KEY, job_id, "{}")  # its ack was lost after it failed
        from tasks.broker.app import redis_client

        assert not put_back_held(beat.default_channel, redis_client(), tag, A)
        assert clean_redis.llen("standard") == 0 and not clean_redis.hexists("unacked", tag)


def test_a_hung_run_is_given_up_and_its_message_put_back(clean_redis, monkeypatch):
    """A run that held its job past any run's time limit without a step: its worker
    stops extending its lease, puts its message back, and the run is lost if it wakes."""
    import pytest

    from gpu_worker.hooks import give_up_hung
    from gpu_worker.runtime import RUNTIME
    from tasks.errors import LeaseLost

    job_id = generate.apply_async(kwargs={"job": {}, "route": {}, "submitted_at": 0.0},
                                  queue="standard").id
    try:
        set_holder(RUNTIME.incarnation)
        with Connection(settings.broker_url, transport_options=cfg.broker_transport_options) as c:
            tag = c.channel().basic_get("standard", no_ack=False).delivery_tag
            vary(monkeypatch, max_job_s=5e-7)  # hung at once: 2 x MAX_JOB_S
            lease = _lease(job_id, RUNTIME.incarnation, tag)
            assert lease.overdue()
            give_up_hung(tag, lease)
    finally:
        set_holder("")
    (raw,) = clean_redis.lrange("standard", 0, -1)
    assert json.loads(raw)["headers"]["id"] == job_id
    assert json.loads(raw)["properties"]["delivery_tag"] != tag
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


def test_a_finish_acks_its_message_in_the_same_step_unless_stale_or_held_by_another(
        clean_redis):
    """A run that still holds its job drops its message's records (kombu's unacked record
    and index entry, the holder) in its finish, and kombu's ack then leaves Redis alone;
    a stale run's finish drops nothing, nor does one whose tag another process holds."""
    from tasks.broker import holder as holding
    from tasks.broker.keys import UNACKED_INDEX_KEY, UNACKED_KEY

    def took(tag: str, holder: str) -> None:
        clean_redis.hset(UNACKED_KEY, tag, "[]")
        clean_redis.zadd(UNACKED_INDEX_KEY, {tag: time.time()})
        clean_redis.hset(HOLDERS_KEY, tag, holder)

    def records(tag: str) -> tuple:
        return (clean_redis.hexists(UNACKED_KEY, tag), clean_redis.zscore(UNACKED_INDEX_KEY, tag)
                is not None, clean_redis.hget(HOLDERS_KEY, tag))

    result = {"attempts": 1, "run_ms": 5.0}
    set_holder(A)
    try:
        took("t1", A)
        lease = _lease("j11", A, "t1")
        assert runs.finish("j11", lease.token, 1, result, "acct", charge_fast=False,
                           ack="t1")[:2] == ("stored", "")
        assert records("t1") == (False, False, None) and "t1" in holding._acked
        # a stale run: its lease lapsed and a newer run began
        took("t3", A)
        old = _lease("j12", A, "t3")
        clean_redis.delete(lease_key("j12"))
        _lease("j12", B, "t4")
        assert runs.finish("j12", old.token, 1, result, "acct", charge_fast=False,
                           ack="t3")[0] == "stale"
        assert records("t3") == (True, True, A.encode()) and "t3" not in holding._acked
        # an AOF that lost its last second handed the same tag to B meanwhile
        took("t5", B)
        lease = _lease("j13", A, "t5")
        assert runs.finish("j13", lease.token, 1, result, "acct", charge_fast=False,
                           ack="t5")[0] == "stored"
        assert records("t5") == (True, True, B.encode())
    finally:
        set_holder("")
        holding._acked.clear()


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


def test_a_take_redis_ran_after_its_caller_gave_up_is_put_back(redis_server, clean_redis,
                                                               monkeypatch):
    """Redis frozen (SIGSTOP) right as a worker that held nothing else records a message
    it popped: the take times out (the default timeout) and kombu drops the message, but
    Redis runs the take once it wakes, recording the message as held by that worker. Its
    keep-alive rounds, which had nothing of their own to refresh, put it back."""
    import os
    import signal
    import threading

    import pytest
    import redis

    from gpu_worker.hooks import HeldJobs, KeepHeld
    from gpu_worker.runtime import RUNTIME
    from tasks.broker import scripts

    job_id = generate.apply_async(kwargs={"job": {}, "route": {}, "submitted_at": 0.0},
                                  queue="standard").id
    run, pid = scripts.run, redis_server.process.pid
    clean_redis.script_load(scripts.source("take"))  # as a worker's many takes have

    def frozen_take(client, name, *args):
        if name == "take":
            os.kill(pid, signal.SIGSTOP)
            threading.Timer(settings.redis_timeout_s + 0.5, os.kill,
                            (pid, signal.SIGCONT)).start()
        return run(client, name, *args)

    keep = KeepHeld(HeldJobs())
    try:
        set_holder(RUNTIME.incarnation)
        with Connection(settings.broker_url, transport_options=cfg.broker_transport_options) as c:
            monkeypatch.setattr(scripts, "run", frozen_take)
            with pytest.raises(redis.TimeoutError):
                c.channel().basic_get("standard", no_ack=False)
            monkeypatch.setattr(scripts, "run", run)
        # Redis woke and ran the take: held here, in no list, out of the ledger
        (tag,) = [t.decode() for t, who in clean_redis.hgetall(HOLDERS_KEY).items()
                  if who.decode() == RUNTIME.incarnation]
        assert clean_redis.llen("standard") == 0 and clean_redis.hexists("unacked", tag)
        assert keep.round(failed=False) is False  # seen once: a take in flight looks alike
        assert clean_redis.hexists("unacked", tag)
        assert keep.round(failed=False) is False  # seen again: an orphan, put back
    finally:
        set_holder("")
    (raw,) = clean_redis.lrange("standard", 0, -1)
    assert json.loads(raw)["headers"]["id"] == job_id
    assert not clean_redis.hexists("unacked", tag) and not clean_redis.hexists(HOLDERS_KEY, tag)
