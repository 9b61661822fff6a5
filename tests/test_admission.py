"""Admission at publish: a job that may move down enters a budgeted lane only while the
work queued ahead of it, by the live depths, lets it start within the lane's admission
wait; the lanes above take the slots they keep busy from the lanes below."""
from __future__ import annotations

import pytest

from beat.record import BUSY_ALPHA, busy_slots, merge
from beat.snapshot import lane_loads
from routing.policy import (
    ADMIT_HOLD_SHARE,
    ADMIT_SPREAD_Z,
    MIN_FREE_SHARE,
    STANDARD_OVERLOADED,
    Admission,
    Hysteresis,
    PolicyView,
    admission_waits,
    admissions,
    admitted_wait,
    decide,
    expected_waits,
    free_slots,
    next_state,
    over_budget,
)
from routing.snapshot import SnapshotCache, base_view
from gpu_worker.runtime import BETWEEN_MAX_MS, Runtime
from tasks.broker.keys import LANE_DEPTHS_KEY
from tasks.broker.message import JobMessage
from tasks.broker.publish import Conditions, publish
from tests.harness.publishing import job_message

SERVICE = {"fast": 1.0, "standard": 1.0, "relaxed": 1.0}


def test_the_lanes_above_take_the_slots_they_keep_busy():
    assert free_slots(4, {"fast": 1.5, "standard": 2.0}) == {
        "fast": 4, "standard": 2.5, "relaxed": 0.5}
    assert free_slots(4, {"fast": 9.0})["standard"] == MIN_FREE_SHARE * 4  # starved
    busy = expected_waits({"standard": 6}, SERVICE, 0, 4, busy={"fast": 2.0})
    idle = expected_waits({"standard": 6}, SERVICE, 0, 4)
    assert idle["standard"] == 1.5 and busy["standard"] == 3.0  # 6 s of work on 2 slots
    assert busy["fast"] == idle["fast"] == 0.0


def test_a_runtime_counts_each_lanes_time_in_flight():
    now = [100.0]
    runtime = Runtime(clock=lambda: now[0])
    runtime.job_started("fast")
    now[0] = 101.0
    runtime.job_started("fast")
    runtime.job_started("standard")
    now[0] = 102.5
    runtime.job_finished("fast", 2500.0)
    assert runtime.busy_until(103.0) == {"fast": 1 + 2 * 1.5 + 0.5, "standard": 2.0}
    assert runtime.stats()["busy_s"] == runtime.busy_until(102.5)


def test_a_runtime_counts_the_time_between_queued_jobs_as_theirs():
    now = [100.0]
    runtime = Runtime(clock=lambda: now[0])
    for gap_ms in (3.0, 2.0, 4.0, 3.5):
        runtime.between_jobs(gap_ms)
    assert runtime.stats()["between_ms"] == 0.0  # too few to go by yet
    # a job handed over from another worker's queue waited for more than the worker:
    # the median leaves out one that stays within BETWEEN_MAX_MS, the bound the others
    runtime.between_jobs(900.0)
    runtime.between_jobs(BETWEEN_MAX_MS + 1)
    runtime.between_jobs(-1.0)
    assert len(runtime.between_ms) == 5
    runtime.job_started("standard")
    now[0] = 100.5
    runtime.job_finished("standard", 500.0, "demo", 1.0)
    # the median between: the job held its slot 3.5 ms more than its run
    assert runtime.stats()["between_ms"] == 3.5
    assert runtime.service_ms == {"standard": 503.5}
    assert runtime.busy_s == {"standard": pytest.approx(0.5035)}
    assert Runtime().stats()["between_ms"] == 0.0  # nothing measured yet


def test_a_job_tells_since_when_it_waited_in_its_lane():
    kwargs = {"job": {}, "route": {"lane": "standard"}, "submitted_at": 5.0}
    assert JobMessage.lane_clock_of(kwargs) == 5.0
    retried = {**kwargs, "route": {"lane": "standard", "lane_since": 9.0}}
    assert JobMessage.lane_clock_of(retried) == 9.0  # due again then, not at its submit
    deferred = {**kwargs, "route": {"lane": "standard", "deferred": True}}
    assert JobMessage.lane_clock_of(deferred) is None  # sent back: it waited on a run
    assert JobMessage.lane_clock_of({"submitted_at": "x"}) is None
    assert JobMessage.lane_clock_of(None) is None


def test_busy_slots_come_from_each_workers_time_in_flight_growing():
    first = {"incarnation": "w/1/0", "at": 10.0, "busy_s": {"fast": 1.0}}
    assert busy_slots(None, first) == {}  # nothing to compare with yet
    second = {**first, "at": 12.0, "busy_s": {"fast": 2.0, "standard": 2.0}}
    record = merge({"w": {**first, "busy": {}}}, {"w": second}, now=12.0, misses_allowed=2)
    assert record["w"]["busy"] == {"fast": 0.5, "standard": 1.0}
    third = {**second, "at": 14.0, "busy_s": {"fast": 2.0, "standard": 4.0}}
    # averaged with the rounds before: fast held no slot this round
    assert busy_slots(record["w"], third) == {"fast": 0.5 * (1 - BUSY_ALPHA),
                                              "standard": 1.0}
    restarted = {**third, "incarnation": "w/2/13", "busy_s": {}}
    assert busy_slots(record["w"], restarted) == {}


def test_an_admission_keeps_a_margin_for_what_the_lanes_above_may_send():
    assert admitted_wait(9.0, {}, 2.0) == 9.0  # nothing above: the target itself
    assert admitted_wait(9.0, {"fast": (0.0, 0.5)}, 2.0) == 9.0
    # 2 slots, fast keeping 1.2 of them busy with jobs of 26 ms (overload.py's pool)
    few = admitted_wait(0.72, {"fast": (1.2, 0.026)}, 0.8)
    spread = ADMIT_SPREAD_Z * (1.2 * 0.026 * few) ** 0.5 / 0.8
    assert few + spread == pytest.approx(0.72)  # two deviations more still start in time
    assert 0.5 * 0.72 < few < 0.8 * 0.72
    # 1,000 GPUs, fast keeping 200 busy with 5.7 s jobs: the margin is a percent or two
    fleet = admitted_wait(54.0, {"fast": (200.0, 5.7)}, 800.0)
    assert 0.97 * 54.0 < fleet < 54.0
    # more busy slots above, or longer jobs there, widen the margin
    assert admitted_wait(0.72, {"fast": (1.2, 0.052)}, 0.8) < few
    assert admitted_wait(9.0, {}, 0.0) == 9.0  # no free slot: nothing to spread over
    # a malformed reply (negative or endless seconds) widens nothing
    assert admitted_wait(9.0, {"fast": (-1.0, 0.5)}, 2.0) == 9.0
    assert admitted_wait(9.0, {"fast": (1.0, float("inf"))}, 2.0) == 9.0


WORKER = {"alive": True, "in_flight": {"fast": 1}, "concurrency": 1,
          "lanes": ["fast", "standard", "relaxed"], "service_ms": {"fast": 500.0,
                                                                "standard": 500.0}}


def test_the_snapshot_states_each_budgeted_lanes_admission():
    workers = {"a": {**WORKER, "busy": {"fast": 0.5}}, "b": {**WORKER, "busy": {}}}
    waits = admission_waits({"fast": 5.0, "standard": 10.0}, 0.9)
    assert waits == {"fast": 4.5, "standard": 9.0}
    loads = lane_loads(workers, {"fast": 1, "standard": 4}, 1.0, admit_wait_s=waits)
    # two slots, half of one busy with fast jobs of 0.5 s: standard waits on 1.5 slots,
    # a margin below 9 s for the fast jobs that may come meanwhile; two running jobs,
    # half of each (0.5 s) ahead
    standard_wait = admitted_wait(9.0, {"fast": (0.5, 0.5)}, 1.5)
    assert 6.0 < standard_wait < 8.0
    assert loads["standard"]["admit_wait_s"] == pytest.approx(standard_wait, abs=1e-4)
    assert loads["standard"]["admit_s"] == pytest.approx(standard_wait * 1.5 - 0.5, abs=1e-3)
    assert loads["fast"]["admit_s"] == pytest.approx(4.5 * 2 - 0.5)  # nothing above fast
    assert "admit_s" not in loads["relaxed"]
    view = base_view({"at": 1.0, "lanes": loads, "policy": {}, "workers": {}})
    assert view.admit["standard"].per_job_s == (("fast", 0.5), ("standard", 0.5))
    assert view.admit["standard"].wait_s == pytest.approx(standard_wait, abs=1e-4)
    assert not over_budget({"fast": 1, "standard": 19}, view.admit["standard"])
    assert over_budget({"fast": 1, "standard": 20}, view.admit["standard"])
    # the last job let in starts within 9 s even with two deviations more fast work,
    # and never makes the lane overloaded by itself
    wait = (0.5 * (1 + 19) + 0.5) / 1.5
    spread = ADMIT_SPREAD_Z * (0.5 * 0.5 * wait) ** 0.5 / 1.5
    assert wait + spread < 9.0 and not next_state(Hysteresis(), wait, 10.0, 0.9, 3).overloaded
    assert admissions({"relaxed": {"depth": 3}}) == {}


def test_the_publish_checks_the_admission_on_the_live_depths(clean_redis, app):
    admission = Admission(2.0, (("fast", 0.5), ("standard", 0.25)), 1.0)

    def outcome(i: int) -> str:
        verdict = publish(clean_redis, job_message(f"t{i}"), Conditions(limits=(admission.limit,)))
        return getattr(verdict, "why", "pushed")

    clean_redis.hset(LANE_DEPTHS_KEY, "fast", 2)  # 1 s of fast work queued ahead
    outcomes = [outcome(i) for i in range(6)]
    assert outcomes == ["pushed"] * 4 + ["over_budget"] * 2  # 1 + 4 x 0.25 reaches 2
    assert int(clean_redis.hget(LANE_DEPTHS_KEY, "standard")) == 4
    assert over_budget({"fast": 2, "standard": 4}, admission)
    assert not over_budget({"fast": 2, "standard": 3}, admission)


def test_an_overloaded_lane_with_an_admission_leaves_the_choice_to_the_publish():
    admission = Admission(2.0, (("fast", 0.5), ("standard", 0.25)), 1.0)
    view = PolicyView(overloaded=frozenset({"standard"}), admit={"standard": admission})
    assert decide("standard", "a", True, view).lane == "standard"  # the publish checks
    shut = view.shut({"standard"})
    moved = decide("standard", "a", True, shut)
    assert (moved.lane, moved.downgrade_reason) == ("relaxed", STANDARD_OVERLOADED)
    assert "standard" not in shut.admit
    # without an admission (a snapshot of an older beat) the overload state moves it
    assert decide("standard", "a", True, PolicyView(overloaded=frozenset({"standard"}))
                  ).lane == "relaxed"
    assert decide("standard", "a", False, shut).lane == "standard"  # may not move


def test_a_lane_past_its_admission_is_shut_to_this_process_for_a_while():
    now = [50.0]
    cache = SnapshotCache(lambda: None, refresh_s=0.5, stale_s=5.0,
                          max_depth={"fast": 9, "standard": 9, "relaxed": 9},
                          clock=lambda: now[0])
    cache.note_over_budget("standard", Admission(1.0, (("standard", 0.1),), 9.0))
    assert cache.shut() == {"standard"}
    now[0] += ADMIT_HOLD_SHARE * 9.0 - 0.01
    assert cache.shut() == {"standard"}
    now[0] += 0.02
    assert cache.shut() == frozenset()
