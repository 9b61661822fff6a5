"""Lane policy as pure functions over synthetic samples and snapshots."""
from __future__ import annotations

import json
import random

import pytest

from beat.health import dead_incarnations, unheard_holders
from beat.record import merge
from beat.snapshot import lane_loads, next_policy
from routing.policy import (
    FAST_OVERLOADED,
    FAST_TIME_EXHAUSTED,
    LANE_FULL,
    NO_CAPACITY_WAIT_S,
    STANDARD_OVERLOADED,
    Hysteresis,
    PolicyView,
    decide,
    expected_waits,
    next_lane,
    next_state,
    relax_levels,
)
from routing.names import LANES
from routing.snapshot import SnapshotCache, base_view, full_lanes

BUDGET = 10.0


def run(series, ratio=0.9, samples=3):
    state, states = Hysteresis(), []
    for wait in series:
        state = next_state(state, wait, BUDGET, ratio, samples)
        states.append(state.overloaded)
    return states


def transitions(states):
    return sum(a != b for a, b in zip([False, *states], states))


def test_enters_at_budget_and_stays_while_high():
    assert run([5, 9.99, 10, 30, 12]) == [False, False, True, True, True]


def test_leaves_only_after_three_consecutive_calm_samples():
    assert run([12, 8, 8, 8, 8]) == [True, True, True, False, False]


def test_a_sample_in_the_band_restarts_the_calm_streak():
    # 9.5 is below the budget but above 90% of it: still overloaded, streak reset
    assert run([12, 8, 8, 9.5, 8, 8, 8]) == [True, True, True, True, True, True, False]


def test_noise_around_the_threshold_does_not_flap():
    noisy = [BUDGET * (1 + 0.05 * (-1) ** i) for i in range(40)]  # 9.5, 10.5, 9.5 ...
    states = run(noisy)
    assert transitions(states) == 1 and all(states[1:])
    plain_threshold = [wait >= BUDGET for wait in noisy]  # what no hysteresis would do
    assert transitions(plain_threshold) > 30


def test_release_ratio_and_samples_are_parameters():
    assert run([12, 9.5, 9.5], ratio=0.99, samples=2) == [True, True, False]


def test_expected_waits_follow_strict_priority():
    service = {"fast": 1.0, "standard": 2.0, "relaxed": 4.0}
    waits = expected_waits({"fast": 4, "standard": 3, "relaxed": 10}, service,
                           in_flight=2, workers=2)
    # half of each running job (mean service 7/3 s), then the lanes above and own
    base = 2 * (7 / 3) / 2
    assert waits["fast"] == pytest.approx((base + 4) / 2)
    assert waits["standard"] == pytest.approx((base + 4 + 6) / 2)
    assert waits["relaxed"] == pytest.approx((base + 4 + 6 + 40) / 2)
    assert expected_waits({}, service, 0, 0)["fast"] == NO_CAPACITY_WAIT_S


def test_relax_levels_by_recent_usage():
    levels = relax_levels({"new": 0.0, "light": 50, "some": 100, "more": 500, "heavy": 5000},
                          unit_s=60)
    assert levels == {"some": 1, "more": 2, "heavy": 3}


VIEW = PolicyView(at=1.0)


@pytest.mark.parametrize("tier,account,downgradable,view,lane,reason", [
    ("fast", "a", False, VIEW, "fast", None),
    ("fast", "a", False, PolicyView(exhausted=frozenset({"a"})), "relaxed", FAST_TIME_EXHAUSTED),
    ("fast", "b", False, PolicyView(exhausted=frozenset({"a"})), "fast", None),
    ("fast", "a", False, PolicyView(overloaded=frozenset({"fast"})), "fast", None),
    ("fast", "a", True, PolicyView(overloaded=frozenset({"fast"})), "standard", FAST_OVERLOADED),
    ("fast", "a", True, PolicyView(overloaded=frozenset({"fast", "standard"})),
     "relaxed", STANDARD_OVERLOADED),
    ("standard", "a", True, PolicyView(overloaded=frozenset({"standard"})),
     "relaxed", STANDARD_OVERLOADED),
    ("standard", "a", False, PolicyView(overloaded=frozenset({"standard"})), "standard", None),
    ("standard", "a", True, PolicyView(overloaded=frozenset({"fast"})), "standard", None),
    ("fast", "a", False, PolicyView(full=frozenset({"fast"})), "standard", LANE_FULL),
    ("fast", "a", False, PolicyView(full=frozenset({"fast", "standard"})), "relaxed", LANE_FULL),
    ("relaxed", "a", True, PolicyView(overloaded=frozenset({"fast", "standard"})), "relaxed", None),
])
def test_decide(tier, account, downgradable, view, lane, reason):
    route = decide(tier, account, downgradable, view)
    assert route.lane == lane and route.requested_tier == tier
    assert route.downgrade_reason == reason
    assert route.downgraded_from == (tier if reason else None)


def test_full_relaxed_lane_has_no_room():
    assert decide("standard", "a", True, PolicyView(full=frozenset({"standard", "relaxed"}))) is None
    assert decide("fast", "a", False, PolicyView(full=frozenset({"relaxed"}))).lane == "fast"


def test_heavy_users_get_a_later_relaxed_priority():
    view = PolicyView(levels={"heavy": 3, "some": 1})
    assert decide("relaxed", "heavy", True, view).priority == 9
    assert decide("relaxed", "some", True, view).priority == 3
    assert decide("relaxed", "new", True, view).priority == 1  # 0: the jobs that aged
    assert decide("fast", "heavy", False, view).priority == 0  # only relaxed is ordered


def test_a_job_the_load_moves_to_relaxed_keeps_its_place_in_time():
    """Moved down by the load (standard overloaded or full), a standard job takes the
    first step of relaxed, with the jobs that aged or waited past their budget, whatever
    its account's level; a fast job out of fast time is its account's relaxed job."""
    view = PolicyView(levels={"heavy": 3}, overloaded=frozenset({"standard"}),
                      exhausted=frozenset({"heavy"}))
    moved = decide("standard", "heavy", True, view)
    assert (moved.lane, moved.downgrade_reason, moved.priority) == \
        ("relaxed", STANDARD_OVERLOADED, 0)
    full = decide("standard", "heavy", True, PolicyView(levels={"heavy": 3},
                                                        full=frozenset({"standard"})))
    assert (full.lane, full.downgrade_reason, full.priority) == ("relaxed", LANE_FULL, 0)
    spent = decide("fast", "heavy", False, view)
    assert (spent.lane, spent.downgrade_reason, spent.priority) == \
        ("relaxed", FAST_TIME_EXHAUSTED, 9)
    assert decide("relaxed", "heavy", True, view).priority == 9


def test_next_lane():
    assert [next_lane(lane) for lane in ("fast", "standard", "relaxed")] == \
        ["standard", "relaxed", None]


SNAPSHOT = {"at": 100.0,
            "lanes": {"fast": {"depth": 3}, "standard": {"depth": 0},
                      "relaxed": {"depth": 9, "expected_wait_s": 42.0}},
            "policy": {"fast": {"overloaded": False, "calm_samples": 0},
                       "standard": {"overloaded": True, "calm_samples": 1}},
            "exhausted": ["a"], "levels": {"h": 2}}
DEPTHS = {"fast": 5, "standard": 5, "relaxed": 10}


def view_from_snapshot(snapshot: dict, sent: dict, max_depth: dict) -> PolicyView:
    """The full routing view of a snapshot, as a router makes it (``SnapshotCache.view``)."""
    return base_view(snapshot).but(full=full_lanes(snapshot, sent, max_depth))


def test_view_counts_jobs_sent_since_the_snapshot():
    view = view_from_snapshot(SNAPSHOT, {}, DEPTHS)
    assert view.overloaded == {"standard"} and view.exhausted == {"a"}
    assert view.full == frozenset() and view.retry_after_s == 42.0
    view = view_from_snapshot(SNAPSHOT, {"fast": 2, "relaxed": 1}, DEPTHS)
    assert view.full == {"fast", "relaxed"}


def test_cache_falls_back_when_stale_and_survives_fetch_errors():
    now = [100.5]
    answers = [json.dumps(SNAPSHOT)]

    def fetch():
        if not answers:
            raise ConnectionError("redis down")
        return answers.pop(0)

    cache = SnapshotCache(fetch, refresh_s=0.5, stale_s=3.0, max_depth=DEPTHS,
                          clock=lambda: now[0])
    cache._thread = object()  # drive refreshes by hand in this test
    cache.refresh()
    assert cache.view().overloaded == {"standard"}
    cache.note_sent("fast"), cache.note_sent("fast")
    assert cache.view().full == {"fast"}
    cache.refresh()  # Redis down: keep the last copy
    assert cache.view() is not None
    now[0] = 104.0  # older than stale_s: plain tier routing
    assert cache.view() is None


def test_sends_count_toward_the_depths_until_a_snapshot_measured_after_them():
    """Each lane's full mark counts the sends made at or after the last snapshot's
    measurement and within ``stale_s`` of the latest send, however many are dropped at
    once (a snapshot after a burst drops thousands)."""
    rng = random.Random(3)
    now, answers, sends = [100.0], [], []
    cache = SnapshotCache(lambda: answers[-1], refresh_s=0.5, stale_s=3.0,
                          max_depth={"fast": 4, "standard": 6, "relaxed": 9},
                          clock=lambda: now[0])
    cache._thread = object()  # drive refreshes by hand in this test
    measured_at = cut = 0.0
    for step in range(600):
        if rng.random() < 0.15 and (not answers or now[0] > json.loads(answers[-1])["at"]):
            measured_at = max(measured_at, now[0] - rng.choice((0.0, 0.05, 0.3)))
            answers.append(json.dumps({**SNAPSHOT, "at": now[0], "measured_at": measured_at,
                                       "lanes": {}}))
            cache.refresh()
        else:
            for _ in range(rng.choice((1, 1, 2, 8))):
                lane = rng.choice(LANES)
                cache.note_sent(lane)
                sends.append((now[0], lane))
                cut = now[0] - cache.stale_s
        now[0] += rng.choice((0.0, 0.01, 0.1, 0.4))
        view = cache.view()
        if view is None:  # no snapshot yet, or older than stale_s
            continue
        counted = [lane for at, lane in sends if at >= measured_at and at >= cut]
        assert view.full == {lane for lane in LANES
                             if counted.count(lane) >= cache.max_depth[lane]}, step


LOADS_WORKERS = {
    "gpu0@h": {"alive": True, "in_flight": {"relaxed": 1}, "lanes": ["fast", "standard", "relaxed"],
               "service_ms": {"relaxed": 2000.0, "fast": 500.0}},
    "gpu1@h": {"alive": True, "in_flight": {}, "lanes": ["fast", "standard", "relaxed"],
               "service_ms": {"relaxed": 4000.0}},
    "gpu2@h": {"alive": False, "in_flight": {"fast": 1}, "lanes": ["fast"],
               "service_ms": {"fast": 99000.0}},
}


def test_lane_loads_use_only_healthy_workers():
    loads = lane_loads(LOADS_WORKERS, {"fast": 2, "standard": 0, "relaxed": 4}, 1.0)
    assert loads["fast"]["workers"] == 2 and loads["fast"]["in_flight"] == 0
    assert loads["relaxed"]["in_flight"] == 1
    assert loads["fast"]["service_s"] == 0.5 and loads["relaxed"]["service_s"] == 3.0
    assert loads["standard"]["service_s"] == 1.75  # unmeasured: mean of the measured lanes
    assert loads["relaxed"]["expected_wait_s"] > loads["fast"]["expected_wait_s"] > 0


def test_next_policy_steps_each_budgeted_lane():
    loads = {"fast": {"expected_wait_s": 20.0}, "standard": {"expected_wait_s": 1.0},
             "relaxed": {"expected_wait_s": 500.0}}
    policy = next_policy({}, loads, {"fast": 10.0, "standard": 60.0}, 0.9, 3)
    assert policy == {"fast": {"overloaded": True, "calm_samples": 0},
                      "standard": {"overloaded": False, "calm_samples": 0}}


def test_no_worker_no_policy_change():
    loads = {lane: {"expected_wait_s": NO_CAPACITY_WAIT_S, "workers": 0}
             for lane in ("fast", "standard", "relaxed")}
    previous = {"fast": {"overloaded": False, "calm_samples": 0},
                "standard": {"overloaded": True, "calm_samples": 2}}
    assert next_policy(previous, loads, {"fast": 10.0, "standard": 60.0}, 0.9, 3) == previous


def test_a_worker_is_dead_after_the_allowed_misses_and_back_when_it_answers():
    record = merge({}, {"w": {"pid": 1}}, now=0.0, misses_allowed=2)
    record = merge(record, {}, now=1.0, misses_allowed=2)
    assert record["w"]["alive"] and record["w"]["missed"] == 1
    record = merge(record, {}, now=2.0, misses_allowed=2)
    assert not record["w"]["alive"]
    record = merge(record, {"w": {"pid": 1}}, now=3.0, misses_allowed=2)
    assert record["w"]["alive"] and record["w"]["missed"] == 0


def test_dead_incarnations():
    workers = {"gpu0@h": {"incarnation": "gpu0@h/20/50.0", "alive": True, "started_at": 50.0},
               "gpu1@h": {"incarnation": "gpu1@h/30/10.0", "alive": False, "started_at": 10.0}}
    holders = ["gpu0@h/10/5.0",    # replaced by a newer process of the same name
               "gpu0@h/20/50.0",   # the live one
               "gpu1@h/30/10.0",   # missed its heartbeats
               "gpu9@h/40/60.0",   # not heard from yet: left alone
               "gpu0@h/10/5.0"]    # holds two messages
    assert dead_incarnations(holders, workers) == {"gpu0@h/10/5.0", "gpu1@h/30/10.0"}


def test_a_holder_never_heard_from_is_judged_like_any_silent_worker():
    """A worker frozen (or killed) before it ever answered a heartbeat, yet holding a job:
    counted from the round its hold was seen, never routed to, dead after the misses."""
    holders = ["gpu2@h/50/70.0"]
    workers = merge({}, {}, now=1.0, misses_allowed=2)
    workers.update(unheard_holders(holders, workers, now=1.0))
    assert not workers["gpu2@h"]["alive"] and not dead_incarnations(holders, workers, 2)
    for now in (2.0, 3.0):
        workers = merge(workers, {}, now=now, misses_allowed=2)
        workers.update(unheard_holders(holders, workers, now))
        assert not workers["gpu2@h"]["alive"]
    assert dead_incarnations(holders, workers, 2) == {"gpu2@h/50/70.0"}
    answered = merge(workers, {"gpu2@h": {"incarnation": "gpu2@h/50/70.0"}}, 4.0, 2)
    assert answered["gpu2@h"]["alive"] and not dead_incarnations(holders, answered, 2)


def test_silence_across_a_gap_in_rounds_is_no_miss():
    """Rounds that stopped (Redis refused writes, or this beat did not lead) resume with
    a round that counts no miss: the workers' pushes were refused meanwhile too. Two
    outages in a row never add up to a worker's death."""
    record = merge({}, {"w": {"pid": 1}}, now=0.0, misses_allowed=2)
    record = merge(record, {}, now=1.0, misses_allowed=2)  # silent once, then an outage
    record = merge(record, {}, now=30.0, misses_allowed=2, count_misses=False)
    assert record["w"]["alive"] and record["w"]["missed"] == 1
    record = merge(record, {}, now=31.0, misses_allowed=2)  # still silent in a steady round
    assert not record["w"]["alive"]
