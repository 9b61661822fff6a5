"""Per-account fast-lane limit: one account cannot flood the fast lane."""
from __future__ import annotations

import base64
import json

import pytest
from conftest import (SMALL, fast_waiting, new_gate, scripts_called, vary, wait_at_gate,
                      wait_until)

from routing.names import LANES
from routing.policy import FAST_ACCOUNT_LIMIT, FAST_TIME_EXHAUSTED, PolicyView, decide
from tasks import submit
from tasks.broker.view import snapshot_cache
from tasks.broker.keys import fast_queued_key, lane_keys
from tasks.jobs.accounts import fast_seconds_left, grant_fast_seconds
from tests.flaky_model import open_gate


@pytest.fixture
def limit(monkeypatch):
    vary(monkeypatch, fast_jobs_per_account=2)
    return 2


@pytest.fixture(scope="module")
def worker(cluster_factory):
    """One worker for the module, no beat: routers see no snapshot of the balances."""
    return cluster_factory(workers=1, beat=False)


def _lanes(client) -> list[int]:
    return [sum(client.llen(key) for key in lane_keys(lane)) for lane in LANES]


def _route_queued_of(client, job_id: str) -> dict:
    """The route of queued job ``job_id``, in whichever lane it waits."""
    for lane in LANES:
        for key in lane_keys(lane):
            for raw in client.lrange(key, 0, -1):
                message = json.loads(raw)
                if message["headers"]["id"] == job_id:
                    return json.loads(base64.b64decode(message["body"]))[1]["route"]
    raise AssertionError(f"job {job_id} is queued in no lane")


def test_over_the_limit_runs_in_standard_and_exhaustion_still_wins():
    over = decide("fast", "a", False, PolicyView(), over_fast_limit=True)
    assert (over.lane, over.downgraded_from, over.downgrade_reason) == \
        ("standard", "fast", FAST_ACCOUNT_LIMIT)
    spent = decide("fast", "a", False, PolicyView(exhausted=frozenset({"a"})),
                   over_fast_limit=True)
    assert (spent.lane, spent.downgrade_reason) == ("relaxed", FAST_TIME_EXHAUSTED)
    assert decide("standard", "a", False, PolicyView(), over_fast_limit=True).lane == "standard"


def test_one_account_holds_at_most_its_places_in_the_fast_lane(limit, clean_redis):
    for i in range(5):
        submit(f"flood {i}", tier="fast", account="flooder", **SMALL)
    assert _lanes(clean_redis) == [2, 3, 0]  # no worker runs: nothing gave a place back
    assert fast_waiting("flooder") == 2
    submit("quiet", tier="fast", account="quiet", **SMALL)  # other accounts are unaffected
    assert _lanes(clean_redis) == [3, 3, 0]
    submit("std", tier="standard", account="flooder", **SMALL)  # no place for standard
    assert fast_waiting("flooder") == 2 and _lanes(clean_redis) == [3, 4, 0]


def test_a_flooding_accounts_next_fast_job_goes_over_its_limit_in_one_publish(
        limit, monkeypatch, clean_redis):
    """Once a publish found the account's places all taken, its next fast jobs go to
    standard in one publish each, and only while every place is still taken: a place
    given back is taken by the next fast job (its over-limit publish refused first)."""
    for i in range(3):  # the third finds both places taken: two publishes
        submit(f"flood {i}", tier="fast", account="hinted", **SMALL)
    called = scripts_called(monkeypatch)
    over = [submit(f"over {i}", tier="fast", account="hinted", **SMALL) for i in range(3)]
    assert called == ["publish"] * 3 and _lanes(clean_redis) == [2, 4, 0]
    assert {_route_queued_of(clean_redis, r.id)["downgrade_reason"] for r in over} == \
        {FAST_ACCOUNT_LIMIT}
    held = clean_redis.zrange(fast_queued_key("hinted"), 0, 0)
    clean_redis.zrem(fast_queued_key("hinted"), *held)  # a fast job started: a place back
    called.clear()
    back = submit("a place came back", tier="fast", account="hinted", **SMALL)
    assert called == ["publish", "publish"] and _lanes(clean_redis) == [3, 4, 0]
    assert "downgrade_reason" not in _route_queued_of(clean_redis, back.id)
    called.clear()  # full again: the next one goes over in one publish once more
    submit("full again", tier="fast", account="hinted", **SMALL)
    assert called == ["publish", "publish"] and _lanes(clean_redis) == [3, 5, 0]
    called.clear()
    submit("and again", tier="fast", account="hinted", **SMALL)
    assert called == ["publish"] and _lanes(clean_redis) == [3, 6, 0]
    submit("others", tier="fast", account="other", **SMALL)  # another account: fast
    assert _lanes(clean_redis) == [4, 6, 0]


def test_zero_means_no_limit(monkeypatch, clean_redis):
    vary(monkeypatch, fast_jobs_per_account=0)
    for i in range(4):
        submit(f"many {i}", tier="fast", account="big", **SMALL)
    assert _lanes(clean_redis) == [4, 0, 0]  # (the set counts them all the same: fairness)
    assert clean_redis.zcard(fast_queued_key("big")) == 4


def test_a_failed_publish_gives_its_place_back(limit, monkeypatch, clean_redis):
    import tasks.broker.enqueue as enqueue

    def broken(*args, **kwargs):
        raise ConnectionError("broker went away")

    monkeypatch.setattr(enqueue, "publish", broken)
    with pytest.raises(ConnectionError):
        submit("lost", tier="fast", account="unlucky", **SMALL)
    assert fast_waiting("unlucky") == 0


def test_places_lapse_so_a_job_that_never_starts_cannot_hold_one(limit, monkeypatch,
                                                                  clean_redis):
    import tasks.broker.enqueue as enqueue

    monkeypatch.setattr(enqueue, "PLACE_LAPSE_S", 0.5)
    orphans = [submit(f"orphan {i}", tier="fast", account="gone", **SMALL).id for i in range(3)]
    assert _lanes(clean_redis) == [2, 1, 0]  # the third found both places taken
    later = []

    def fast_again() -> bool:
        later.append(submit("later", tier="fast", account="gone", **SMALL).id)
        return _lanes(clean_redis)[0] == 3

    wait_until(fast_again, timeout_s=10, what="a lapsed place to be taken again")
    # the first place lapsed first: it went as the new one was taken (the second may
    # have lapsed too by then, or not yet, on a busy machine)
    held = {m.decode() for m in clean_redis.zrange(fast_queued_key("gone"), 0, -1)}
    assert later[-1] in held and orphans[0] not in held and held <= {orphans[1], later[-1]}


def test_a_publish_that_reaches_redis_too_late_takes_nothing(limit, monkeypatch, clean_redis):
    """The place is taken in the publish itself: a publish Redis runs after its caller
    gave up (here: a deadline already past) writes no job, no count, no place."""
    import tasks.broker.enqueue as enqueue
    from tasks.broker.keys import LANE_DEPTHS_KEY, LIST_DEPTHS_KEY, due_key
    from tasks.errors import BrokerUnavailable

    monkeypatch.setattr(enqueue, "publish_deadline", lambda: 1.0)  # 1970 on Redis' clock
    with pytest.raises(BrokerUnavailable, match="too late"):
        submit("late", tier="fast", account="late", **SMALL)
    assert _lanes(clean_redis) == [0, 0, 0]
    assert not clean_redis.exists(LANE_DEPTHS_KEY, LIST_DEPTHS_KEY, due_key("fast"))
    assert fast_waiting("late") == 0


def test_a_job_moved_down_by_its_deadline_gives_its_place_back(limit, clean_redis):
    import time

    from beat.movers import enforce_deadlines

    for i in range(2):
        submit(f"slow {i}", tier="fast", account="mover", downgradable=True, **SMALL)
    assert fast_waiting("mover") == 2
    moved = enforce_deadlines(clean_redis, {"fast": 1.0}, now=time.time() + 60)
    assert moved["fast"] == 2 and _lanes(clean_redis) == [0, 2, 0]
    assert fast_waiting("mover") == 0


def test_spent_fast_time_moves_the_next_fast_submit_without_a_snapshot(limit, clean_redis,
                                                                       monkeypatch):
    grant_fast_seconds("tight", 0.01 - fast_seconds_left("tight"))
    submit("still fast", tier="fast", account="tight", **SMALL)
    assert _lanes(clean_redis) == [1, 0, 0]
    grant_fast_seconds("tight", -0.02)  # a fast run ends: the balance is spent
    spent = submit("spent", tier="fast", account="tight", **SMALL)
    assert snapshot_cache().view() is None  # no beat: no snapshot says it is spent
    assert _lanes(clean_redis) == [1, 0, 1]
    route = _route_queued_of(clean_redis, spent.id)
    assert (route["downgraded_from"], route["downgrade_reason"]) == ("fast",
                                                                     FAST_TIME_EXHAUSTED)
    assert fast_waiting("tight") == 1  # the refused publish took no fast place
    vary(monkeypatch, fast_seconds_default=0.0)  # never charged: the default
    submit("nothing to start with", tier="fast", account="newcomer", **SMALL)
    assert _lanes(clean_redis) == [1, 0, 2]


@pytest.mark.cluster
def test_places_come_back_when_jobs_start(limit, worker):
    gate = new_gate()
    blocker = submit(f"gate:{gate} hold the worker", model="flaky", tier="fast",
                     account="other", **SMALL)
    wait_at_gate(blocker, gate)  # the only worker is busy: nothing else starts
    burst = [submit(f"burst {i}", tier="fast", account="burst", **SMALL) for i in range(5)]
    open_gate(gate)
    results = [r.get(timeout=60) for r in burst]
    assert [r["lane"] for r in results] == ["fast"] * 2 + ["standard"] * 3
    assert {r.get("downgrade_reason") for r in results[2:]} == {FAST_ACCOUNT_LIMIT}
    assert all("downgraded_from" not in r for r in results[:2])
    wait_until(lambda: fast_waiting("burst") == 0, what="places given back")
    assert submit("again", tier="fast", account="burst", **SMALL).get(timeout=60)["lane"] == "fast"
    blocker.get(timeout=60)


@pytest.mark.cluster
def test_a_revoked_fast_job_gives_its_place_back(limit, app, worker):
    gate = new_gate()
    blocker = submit(f"gate:{gate} hold the worker", model="flaky", tier="fast",
                     account="other", **SMALL)
    wait_at_gate(blocker, gate)
    doomed = submit("never mind", tier="fast", account="canceller", **SMALL)
    assert fast_waiting("canceller") == 1
    doomed.revoke()
    open_gate(gate)
    blocker.get(timeout=60)
    wait_until(lambda: fast_waiting("canceller") == 0, what="the revoked job's place back")


@pytest.mark.cluster
def test_fast_jobs_stop_at_the_first_submit_after_the_balance_runs_out(worker):
    account, start_s = "meter", 0.05
    grant_fast_seconds(account, start_s - fast_seconds_left(account))
    fast_runs_s = []
    for i in range(500):
        left = fast_seconds_left(account)
        out = submit(f"meter {i}", tier="fast", account=account, **SMALL).get(timeout=60)
        if left <= 0:  # the first submit after the balance ran out
            break
        assert out["lane"] == "fast", (i, left)
        fast_runs_s.append(out["run_ms"] / 1000)
    assert (out["lane"], out.get("downgrade_reason")) == ("relaxed", FAST_TIME_EXHAUSTED)
    over_s = -fast_seconds_left(account)  # charged past zero: the last fast run's remainder
    assert 0 <= over_s < fast_runs_s[-1] + 1e-6
