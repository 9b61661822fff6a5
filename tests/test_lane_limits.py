"""Lane limits: the publish itself checks the lane's depth in Redis.

A submitter's view of lane depths is an estimate (the last snapshot plus its
own sends); these tests run with no snapshot at all, so only the check in the
transport's publish script stands between a burst and an overfull lane.
"""
from __future__ import annotations

import base64
import json
import threading
import time
import uuid
from collections import Counter

import pytest
from conftest import SMALL, fast_waiting, vary
from kombu import Exchange, Queue

from routing.names import LANES, worker_queue
from routing.snapshot import SnapshotCache
from tasks import submit
from tasks.broker.view import snapshot_cache
from tasks.broker.keys import LANE_DEPTHS_KEY, LIST_DEPTHS_KEY, due_key, lane_keys, lists_key
from tasks.errors import LaneFull
from tasks.jobs.schema import validate
from tasks.worker.generate import generate

LIMITS = {"fast": 4, "standard": 6, "relaxed": 10}


@pytest.fixture
def limits(monkeypatch):
    # The router's copy of the limits too (made, with the defaults, before they change),
    # and back after: later tests keep the defaults.
    monkeypatch.setattr(snapshot_cache(), "max_depth", dict(LIMITS))
    vary(monkeypatch, max_depth=dict(LIMITS))
    return LIMITS


def depth(client, lane: str) -> int:
    return sum(client.llen(key) for key in client.smembers(lists_key(lane)))


def queued_routes(client, lane: str) -> list[dict]:
    return [json.loads(base64.b64decode(json.loads(raw)["body"]))[1]["route"]
            for key in client.smembers(lists_key(lane)) for raw in client.lrange(key, 0, -1)]


def test_many_submitters_at_once_never_pass_the_limit(limits, clean_redis):
    outcomes: Counter[str] = Counter()
    start, counting = threading.Barrier(6), threading.Lock()

    def submitter(n: int) -> None:
        start.wait()
        for i in range(15):
            try:
                submit(f"burst {n}.{i}", tier="relaxed", account=f"a{n}", **SMALL)
                outcome = "accepted"
            except LaneFull as exc:
                outcome = "refused" if exc.lane == "relaxed" else f"named {exc.lane}"
            with counting:
                outcomes[outcome] += 1

    threads = [threading.Thread(target=submitter, args=(n,)) for n in range(6)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    assert outcomes == {"accepted": LIMITS["relaxed"], "refused": 90 - LIMITS["relaxed"]}
    assert depth(clean_redis, "relaxed") == LIMITS["relaxed"]
    # refused ones left no trace: not counted, not indexed
    assert int(clean_redis.hget(LANE_DEPTHS_KEY, "relaxed")) == LIMITS["relaxed"]
    assert sum(int(n) for n in clean_redis.hvals(LIST_DEPTHS_KEY)) == LIMITS["relaxed"]
    first = lane_keys("relaxed")[0]  # its first level holds moved and aged jobs only
    assert clean_redis.llen(first) == 0
    assert clean_redis.zcard(due_key("relaxed")) == LIMITS["relaxed"]


def test_a_full_lane_spills_down_and_gives_back_the_fast_place(limits, monkeypatch,
                                                               clean_redis):
    vary(monkeypatch, fast_jobs_per_account=100)
    for i in range(sum(LIMITS.values())):
        submit(f"spill {i}", tier="fast", account="payer", **SMALL)
    with pytest.raises(LaneFull):
        submit("one too many", tier="fast", account="payer", **SMALL)
    assert {lane: depth(clean_redis, lane) for lane in LANES} == LIMITS
    assert fast_waiting("payer") == LIMITS["fast"]  # only the jobs that wait in fast
    for lane in ("standard", "relaxed"):
        routes = queued_routes(clean_redis, lane)
        assert {(r["downgraded_from"], r["downgrade_reason"]) for r in routes} == \
            {("fast", "lane_full")}, routes


def test_jobs_already_accepted_are_never_refused_and_count_toward_the_depth(
        limits, app, clean_redis):
    """Moves, retries and restores publish outside ``submit()``: a full lane takes
    them anyway. Every list of the lane counts: a worker's own queue of it and
    every priority level."""
    own = worker_queue("relaxed", "gpu9@limits")
    with app.connection_for_write() as conn:
        Queue(own, Exchange(own), routing_key=own)(conn.default_channel).declare()
    job = validate("moved", tier="relaxed", account="a", model="demo", seed=1, **SMALL).encode()
    route = {"lane": "relaxed", "requested_tier": "relaxed"}
    for priority in (3, 9, 9):
        generate.apply_async(kwargs={"job": job, "route": route, "submitted_at": time.time()},
                             task_id=str(uuid.uuid4()), exchange=own, routing_key=own,
                             priority=priority)
    assert sum(clean_redis.llen(k) for k in lane_keys(own)) == 3
    accepted = 0
    with pytest.raises(LaneFull):
        for i in range(LIMITS["relaxed"]):
            submit(f"after {i}", tier="relaxed", **SMALL)
            accepted += 1
    assert accepted == LIMITS["relaxed"] - 3
    for _ in range(2):  # the lane is full; a job moved into it still goes in
        generate.apply_async(kwargs={"job": job, "route": route, "submitted_at": time.time()},
                             task_id=str(uuid.uuid4()), queue="relaxed")
    assert depth(clean_redis, "relaxed") == LIMITS["relaxed"] + 2


def test_a_refused_lane_is_held_full_until_a_later_snapshot():
    now = [100.0]
    snapshot = {"at": 100.0, "measured_at": 100.0}
    cache = SnapshotCache(lambda: json.dumps(snapshot), refresh_s=0.5, stale_s=5.0,
                          max_depth=LIMITS, clock=lambda: now[0])
    cache.refresh()
    now[0] = 100.2
    cache.note_full("fast")
    assert cache.refused() == {"fast"}
    snapshot.update(at=100.4, measured_at=100.1)  # measured before the refusal
    cache.refresh()
    assert cache.refused() == {"fast"}
    snapshot.update(at=100.6, measured_at=100.3)  # measured after it
    cache.refresh()
    assert cache.refused() == frozenset()
    cache.note_full("relaxed")  # without snapshots it lapses after one heartbeat
    now[0] = 101.3
    assert cache.refused() == frozenset()


def test_a_refused_publish_leaves_no_result_subscription(limits, clean_redis):
    """Celery subscribes to a job's result before it publishes; a job refused at
    the publish never gets an AsyncResult to unsubscribe it."""
    consumer = generate.backend.result_consumer
    kept = [submit(f"fill {i}", tier="relaxed", **SMALL) for i in range(LIMITS["relaxed"])]
    before = set(consumer.subscribed_to)
    for i in range(5):
        with pytest.raises(LaneFull):
            submit(f"refused {i}", tier="relaxed", **SMALL)
        snapshot_cache().forget()  # no held-full mark: each try reaches the publish
    assert set(consumer.subscribed_to) == before
    assert len(kept) == depth(clean_redis, "relaxed")


def test_a_publish_retried_after_a_lost_reply_pushes_once(app, clean_redis):
    """redis-py sends a command again on a new connection when the old one broke before
    its reply: the same publish, run twice, queues its job once."""
    from tasks.broker.keys import LANE_DEPTHS_KEY
    from tasks.broker.publish import Pushed, publish
    from tests.harness.publishing import job_message

    message = job_message("job-1")
    for _ in range(2):  # the second call is a retry of the first: the same message
        assert publish(clean_redis, message) == Pushed()
    assert clean_redis.llen("standard") == 1
    assert int(clean_redis.hget(LANE_DEPTHS_KEY, "standard")) == 1
