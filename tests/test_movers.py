"""Deadline downgrades and relax aging on real messages in the test Redis."""
from __future__ import annotations

import base64
import json
import time

import pytest
from conftest import SMALL, bind_own_queues

from beat.movers import age_relaxed, enforce_deadlines
from tasks.broker.keys import lane_keys
from tasks.jobs.schema import validate
from tasks.worker.generate import generate

BUDGETS = {"fast": 10.0, "standard": 60.0}


def _publish(tier: str, lane: str, priority: int = 0, waited_s: float = 0.0,
             downgradable: bool = True) -> str:
    job = validate("p", tier=tier, account="acct", model="demo", seed=1,
                   downgradable=downgradable, **SMALL)
    result = generate.apply_async(kwargs={
        "job": job.encode(), "route": {"lane": lane, "requested_tier": tier},
        "submitted_at": time.time() - waited_s}, priority=priority,
        # a worker's own queue is addressed by its exchange, as enqueue does
        **({"exchange": lane, "routing_key": lane} if "." in lane else {"queue": lane}))
    return result.id


def _messages(client, key: str) -> list[dict]:
    return [json.loads(raw) for raw in client.lrange(key, 0, -1)]


def _kwargs(message: dict) -> dict:
    return json.loads(base64.b64decode(message["body"]))[1]


def test_jobs_past_budget_move_to_the_front_of_the_lane_below(clean_redis):
    waiting = _publish("standard", "standard", waited_s=1)
    stale = _publish("fast", "fast", waited_s=11)
    fresh = _publish("fast", "fast", waited_s=1)
    moved = enforce_deadlines(clean_redis, BUDGETS)
    assert moved == {"fast": 1, "standard": 0}
    assert [m["headers"]["id"] for m in _messages(clean_redis, "fast")] == [fresh]
    # kombu pops from the right: the moved job is next in standard, before `waiting`
    standard = _messages(clean_redis, "standard")
    assert [m["headers"]["id"] for m in standard] == [waiting, stale]
    route = _kwargs(standard[-1])["route"]
    assert route.pop("lane_since") == pytest.approx(time.time(), abs=5)
    assert route == {"lane": "standard", "requested_tier": "fast",
                     "downgraded_from": "fast", "downgrade_reason": "waited_past_budget"}
    assert standard[-1]["properties"]["delivery_info"]["routing_key"] == "standard"
    # in its new lane the budget starts again: it is not moved on at once
    assert enforce_deadlines(clean_redis, BUDGETS) == {"fast": 0, "standard": 0}


@pytest.mark.parametrize("junk", [b"not json", b"[1, 2]", b'{"body": "!!"}',
                                  json.dumps({"body": base64.b64encode(b"[1]").decode(),
                                              "headers": {}}).encode()])
def test_a_message_that_is_no_job_is_left_for_the_workers(clean_redis, junk):
    clean_redis.lpush("fast", junk)  # the oldest
    stale = _publish("fast", "fast", waited_s=11)
    assert enforce_deadlines(clean_redis, BUDGETS) == {"fast": 1, "standard": 0}
    assert clean_redis.lrange("fast", 0, -1) == [junk]
    assert [m["headers"]["id"] for m in _messages(clean_redis, "standard")] == [stale]


def test_jobs_that_may_not_be_downgraded_stay_without_blocking_others(clean_redis):
    stuck = _publish("fast", "fast", waited_s=30, downgradable=False)
    movable = _publish("fast", "fast", waited_s=20)
    assert enforce_deadlines(clean_redis, BUDGETS) == {"fast": 1, "standard": 0}
    assert [m["headers"]["id"] for m in _messages(clean_redis, "fast")] == [stuck]
    assert [m["headers"]["id"] for m in _messages(clean_redis, "standard")] == [movable]


def test_relaxed_is_never_moved_and_nothing_is_lost(clean_redis):
    for _ in range(3):
        _publish("relaxed", "relaxed", waited_s=10_000)
    ids = {_publish("standard", "standard", waited_s=61) for _ in range(5)}
    assert enforce_deadlines(clean_redis, BUDGETS) == {"fast": 0, "standard": 5}
    relaxed = _messages(clean_redis, "relaxed")
    assert len(relaxed) == 8 and ids <= {m["headers"]["id"] for m in relaxed}


def test_old_relaxed_jobs_jump_to_the_front_of_the_first_level(clean_redis):
    keys = lane_keys("relaxed")
    light = _publish("relaxed", "relaxed", priority=1, waited_s=1)  # a light account's
    old = _publish("relaxed", "relaxed", priority=9, waited_s=100)
    older_mid = _publish("relaxed", "relaxed", priority=3, waited_s=200)
    young = _publish("relaxed", "relaxed", priority=9, waited_s=1)
    assert age_relaxed(clean_redis, aging_s=60) == 2
    first = _messages(clean_redis, keys[0])
    # next to run (rightmost): the oldest, both above the light account's fresh job
    assert [m["headers"]["id"] for m in first] == [old, older_mid]
    assert all(m["properties"]["priority"] == 0 for m in first)
    assert [m["headers"]["id"] for m in _messages(clean_redis, keys[1])] == [light]
    assert [m["headers"]["id"] for m in _messages(clean_redis, keys[-1])] == [young]
    assert age_relaxed(clean_redis, aging_s=60) == 0


def test_an_aged_job_of_the_shared_lane_goes_before_a_workers_own_fresh_jobs(clean_redis, app):
    """A worker takes its own queue's jobs before the shared lane's of the same level
    (the take reads its queues level by level): an aged job is lifted above every
    account's level, so a stream of fresh jobs routed to the worker never holds it."""
    from kombu import Consumer, Exchange, Queue

    from routing.names import worker_queue, worker_queues

    node = "gpu0@aging"
    taken: list[str] = []
    with app.connection_for_read() as connection:
        queues = [Queue(name, Exchange(name, "direct"), routing_key=name)
                  for name in worker_queues(node)]
        with Consumer(connection, queues, accept=["json"], prefetch_count=1,
                      callbacks=[lambda _body, m: (taken.append(m.headers["id"]), m.ack())]):
            own = [_publish("relaxed", worker_queue("relaxed", node), priority=1)
                   for _ in range(2)]
            aged = _publish("relaxed", "relaxed", priority=1, waited_s=100)
            assert age_relaxed(clean_redis, aging_s=60) == 1
            while len(taken) < 3:
                connection.drain_events(timeout=10)
    assert taken == [aged, *own]


def test_moved_jobs_keep_their_order_and_block_nobody(clean_redis):
    native = _publish("standard", "standard", waited_s=120)  # long past standard's budget
    a, b = (_publish("fast", "fast", waited_s=w) for w in (30, 20))
    enforce_deadlines(clean_redis, BUDGETS)  # a and b move to the front of standard...
    order = [m["headers"]["id"] for m in reversed(_messages(clean_redis, "standard"))]
    assert order[:2] == [a, b]  # ...oldest first
    enforce_deadlines(clean_redis, BUDGETS)  # they have a fresh budget there and stay,
    relaxed = [m["headers"]["id"] for m in _messages(clean_redis, "relaxed")]
    assert relaxed == [native]  # but do not shield the standard job behind them


def test_aged_jobs_keep_their_order(clean_redis):
    old, mid, young = (_publish("relaxed", "relaxed", priority=3, waited_s=w)
                       for w in (300, 200, 100))
    assert age_relaxed(clean_redis, aging_s=60) == 3
    order = [m["headers"]["id"] for m in reversed(_messages(clean_redis, lane_keys("relaxed")[0]))]
    assert order == [old, mid, young]


def test_a_job_moved_to_relaxed_keeps_its_place_in_time(clean_redis):
    """Moved into relaxed's first level (past its budget, or aged), a job goes behind the
    jobs moved there in earlier rounds: a later round's moves never go ahead of them."""
    first = _publish("standard", "standard", waited_s=120)
    assert enforce_deadlines(clean_redis, BUDGETS)["standard"] == 1
    second = _publish("standard", "standard", waited_s=90)
    aged = _publish("relaxed", "relaxed", priority=9, waited_s=100)
    assert enforce_deadlines(clean_redis, BUDGETS)["standard"] == 1
    assert age_relaxed(clean_redis, aging_s=60) == 1
    order = [m["headers"]["id"] for m in reversed(_messages(clean_redis, lane_keys("relaxed")[0]))]
    assert order == [first, second, aged]  # next to run first


def test_a_gone_workers_own_queue_returns_to_the_front_of_the_shared_lane(clean_redis, app):
    from beat.shared import return_to_shared_lanes
    from routing.names import worker_queue

    ghost, own = "gpu9@gone", worker_queue("fast", "gpu9@gone")
    bind_own_queues(app, own)  # bound, as the worker did while it lived
    waiting = _publish("fast", "fast")
    for _ in range(2):  # queued for the ghost
        _publish("fast", own)
    assert return_to_shared_lanes(clean_redis, ghost) == 2
    shared = _messages(clean_redis, "fast")
    assert shared[0]["headers"]["id"] == waiting  # the ghost's jobs are next, in order
    assert all(m["properties"]["delivery_info"]["routing_key"] == "fast" for m in shared)
    assert clean_redis.llen(own) == 0


def test_a_standard_job_queued_for_a_worker_moves_to_its_own_relaxed_queue(clean_redis, app):
    """Past its budget in a worker's own standard queue, a job stays that worker's (it
    holds the model warm), at the back of its own relaxed queue's first level; the
    shared lane's jobs go to the shared relaxed lane, as before."""
    from routing.names import worker_queue

    node = "gpu0@keep"
    bind_own_queues(app, worker_queue("relaxed", node), worker_queue("standard", node))
    earlier = _publish("relaxed", worker_queue("relaxed", node), waited_s=1)
    own = _publish("standard", worker_queue("standard", node), waited_s=61)
    shared = _publish("standard", "standard", waited_s=61)
    assert enforce_deadlines(clean_redis, BUDGETS) == {"fast": 0, "standard": 2}
    mine = [m["headers"]["id"] for m in reversed(_messages(clean_redis,
                                                             worker_queue("relaxed", node)))]
    assert mine == [earlier, own]  # next to run first: it went to the back
    assert [m["headers"]["id"] for m in _messages(clean_redis, "relaxed")] == [shared]
    assert clean_redis.llen(worker_queue("standard", node)) == 0
    assert _kwargs(_messages(clean_redis, worker_queue("relaxed", node))[0])["route"][
        "downgrade_reason"] == "waited_past_budget"
