"""The health check's put-back against a worker's own give-back and ack: a message goes
back only if the dead worker still holds it, never while another worker does."""
from __future__ import annotations

import json
import time

import pytest

from beat.health import RECOVERED_FIELD, requeue_dead
from tasks.broker import handover
from tasks.broker.holder import set_holder
from tasks.broker.keys import METRICS_KEY, lane_keys, lease_key
from tasks.broker.holder import token_of
from tasks.worker.generate import generate

A, B = "gpu0@h/1/1.0", "gpu1@h/2/2.0"
#: The heartbeat's view: A died (missed its rounds), B lives.
WORKERS = {"gpu0@h": {"incarnation": A, "alive": False, "started_at": 1.0, "missed": 3},
           "gpu1@h": {"incarnation": B, "alive": True, "started_at": 2.0, "missed": 0}}


def _publish() -> str:
    return generate.apply_async(kwargs={"job": {}, "route": {}, "submitted_at": time.time()},
                                queue="standard").id


def _ids(client, key="standard") -> list[str]:
    return [json.loads(raw)["headers"]["id"] for raw in client.lrange(key, 0, -1)]


def _requeue(client) -> int:
    """beat's health check: every holder on record, judged by :data:`WORKERS`."""
    return requeue_dead(client, WORKERS, handover.holders(client), misses_allowed=2)


def test_a_dead_holders_message_goes_back_to_its_lane(clean_redis):
    job = _publish()
    sent = clean_redis.lrange("standard", 0, -1)
    handover.take(clean_redis, A, lane_keys("standard"), "t1")  # its lease has lapsed: none
    assert _ids(clean_redis) == [] and handover.holders(clean_redis) == {A}
    assert _requeue(clean_redis) == 1
    assert clean_redis.lrange("standard", 0, -1) == sent  # as it was published: job
    assert _ids(clean_redis) == [job]
    assert handover.held(clean_redis, A) == {} and handover.holders(clean_redis) == set()
    assert int(clean_redis.hget(METRICS_KEY, RECOVERED_FIELD)) == 1
    assert _requeue(clean_redis) == 0  # nothing left to put back: one copy


def test_a_silent_holder_that_still_extends_its_lease_keeps_the_message(clean_redis):
    job = _publish()
    handover.take(clean_redis, A, lane_keys("standard"), "t1")
    clean_redis.set(lease_key(job), f"{A}#1#t1", ex=5)  # a warm shutdown runs it
    assert _requeue(clean_redis) == 0
    assert _ids(clean_redis) == [] and set(handover.held(clean_redis, A)) == {"t1"}
    clean_redis.delete(lease_key(job))  # it died: the lease lapses
    assert _requeue(clean_redis) == 1
    assert _ids(clean_redis) == [job]
    # should it wake, the run that let its lease lapse cannot take it again; the copy can
    assert clean_redis.get(lease_key(job)) == b"released#put-back"


@pytest.mark.parametrize("late", ["ack", "restore"])
def test_a_message_another_worker_took_stays_with_it(clean_redis, app, late):
    """A froze holding a message, beat put it back and B took it. A wakes up late and
    acks its copy, or closes its channel (its shutdown gives back what it holds): each
    drops A's own record only, never B's, and pushes nothing: nothing runs twice."""
    job = _publish()
    set_holder(A)
    try:
        with app.connection_for_write() as conn:
            channel = conn.channel()
            tag = channel.basic_get("standard", no_ack=False).delivery_tag
            assert set(handover.held(clean_redis, A)) == {token_of(tag)}
            assert _requeue(clean_redis) == 1  # A is dead to beat
            taken = handover.take(clean_redis, B, lane_keys("standard"), "tb")  # B's take
            assert json.loads(taken.raw)["headers"]["id"] == job
            assert _requeue(clean_redis) == 0  # A holds nothing now: B keeps it
            if late == "ack":
                channel.qos.ack(tag)
        # the channel closed here, with A's copy unacked if it was not acked
    finally:
        set_holder("")
    assert handover.held(clean_redis, B) == {"tb": (taken.key, taken.raw)}  # B's record stands
    assert handover.held(clean_redis, A) == {}
    assert job not in _ids(clean_redis)  # B keeps it: nothing runs twice
