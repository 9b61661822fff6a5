"""Load-aware lanes on a real cluster: one worker, beat, the session Redis."""
from __future__ import annotations

import json
import math
import time
from collections import Counter

import pytest
from conftest import SMALL, new_gate, wait_at_gate, wait_until

from tasks import submit
from tasks.broker.view import snapshot_cache
from routing.policy import FAIR_UNIT_S
from tasks.broker.keys import LANE_DEPTHS_KEY, SNAPSHOT_KEY, USAGE_BUCKET_S, usage_key
from tasks.errors import JobFailed, LaneFull
from tasks.jobs.accounts import fast_seconds_left, grant_fast_seconds
from tasks.jobs.deadletter import dead_jobs, requeue
from tests.flaky_model import open_gate

pytestmark = pytest.mark.cluster
#: The relaxed-lane aging bound this module's workers run with: the standard budget.
AGING_S = 2.0
CLUSTER_ENV = {"GPULANES_MAX_WAIT_S": f"fast=5,standard={AGING_S:g}"}


@pytest.fixture(scope="module")
def cluster(cluster_factory):
    return cluster_factory(workers=1, beat=True, env=CLUSTER_ENV)


def _make_heavy(client, account: str) -> None:
    """Record two fair-share units of GPU time for ``account`` in this window, as its
    workers' stats pushes would; wait until routers rank it below newcomers."""
    bucket = usage_key(int(time.time()) // USAGE_BUCKET_S)
    client.hincrbyfloat(bucket, account, 2 * FAIR_UNIT_S)
    client.expire(bucket, 3600)
    _view_has(lambda v: v.levels.get(account, 0) >= 1)


def _snapshot(client) -> dict:
    raw = client.get(SNAPSHOT_KEY)
    return json.loads(raw) if raw else {}


def _policy(client, lane: str) -> bool | None:
    return _snapshot(client).get("policy", {}).get(lane, {}).get("overloaded")


def _view_has(check):
    return wait_until(lambda: (v := snapshot_cache().view()) is not None and check(v),
                      what="the submitting process to see the new snapshot")


def test_standard_overload_downgrades_new_jobs_then_recovers(cluster, clean_redis):
    gate = new_gate()
    blocker = submit(f"gate:{gate} hold", model="flaky", tier="fast", **SMALL)
    wait_at_gate(blocker, gate)
    backlog = [submit(f"backlog {i}", tier="standard", seed=i, downgradable=False, **SMALL)
               for i in range(150)]
    wait_until(lambda: _policy(clean_redis, "standard"), what="standard overloaded")
    _view_has(lambda v: "standard" in v.overloaded)
    moved = submit("probe", tier="standard", **SMALL)
    kept = submit("probe", tier="standard", downgradable=False, **SMALL)
    open_gate(gate)
    out = moved.get(timeout=60)
    assert out["lane"] == "relaxed" and out["requested_tier"] == "standard"
    assert out["downgraded_from"] == "standard"
    assert out["downgrade_reason"] == "standard_overloaded"
    # not downgradable: never moved by the overload policy (the deadline may still move it)
    assert kept.get(timeout=60).get("downgrade_reason") != "standard_overloaded"
    for result in backlog:
        result.get(timeout=120)
    wait_until(lambda: _policy(clean_redis, "standard") is False, what="standard back to normal")
    _view_has(lambda v: "standard" not in v.overloaded)
    assert submit("after", tier="standard", **SMALL).get(timeout=60)["lane"] == "standard"


def test_standard_jobs_enter_while_the_live_depth_lets_them_start_in_budget(cluster,
                                                                           clean_redis):
    for i in range(3):  # the worker's pace measured: its admission counts on it
        submit(f"pace {i}", tier="standard", **SMALL).get(timeout=60)
    gate = new_gate()  # a relaxed job holds the one worker: its slot is no lane above's
    blocker = submit(f"gate:{gate} hold", model="flaky", tier="relaxed", **SMALL)
    wait_at_gate(blocker, gate)
    started = time.time()
    try:
        _view_has(lambda v: v.at > started and v.admit.get("standard", (0,))[0] > 0)
        before = snapshot_cache().view()
        per_job_s = dict(before.admit["standard"][1])["standard"]
        room = math.ceil(before.admit["standard"][0] / per_job_s)  # nothing queued ahead
        assert 0 < room < 1000
        jobs, views = [], [before]  # every snapshot a publish may have held
        for i in range(room + 40):
            jobs.append(submit(f"admit {i}", tier="standard", seed=i, **SMALL))
            views.append(snapshot_cache().view())
        queued = int(clean_redis.hget(LANE_DEPTHS_KEY, "standard"))
    finally:
        open_gate(gate)
    reasons = Counter(r.get("downgrade_reason") for r in [r.get(timeout=120) for r in jobs])
    # the publish let jobs in up to the admission, whichever snapshot it held; the rest
    # moved down at once, while no snapshot said the lane was overloaded (the deadline
    # mover may still move one that waited past its budget: waited_past_budget)
    most = max(math.ceil(view.admit["standard"][0] / dict(view.admit["standard"][1])["standard"])
               for view in views)  # each priced by its own measured pace
    assert 0 < queued <= most
    assert reasons["standard_overloaded"] == len(jobs) - queued > 0
    assert set(reasons) <= {None, "standard_overloaded", "waited_past_budget"}
    assert not any("standard" in view.overloaded for view in views)
    assert _policy(clean_redis, "standard") is False


def test_fast_seconds_are_charged_for_completed_fast_runs_only(cluster):
    account = "payer"
    before = fast_seconds_left(account)
    out = submit("charged", tier="fast", account=account, seed=1, **SMALL).get(timeout=60)
    after = fast_seconds_left(account)
    assert before - after == pytest.approx(out["run_ms"] / 1000, abs=1e-3)
    submit("free", tier="standard", account=account, **SMALL).get(timeout=60)
    with pytest.raises(JobFailed):
        submit("bug free", tier="fast", model="flaky", account=account, **SMALL).get(timeout=60)
    assert fast_seconds_left(account) == pytest.approx(after)


def test_spent_fast_time_sends_fast_jobs_to_relaxed_until_granted(cluster):
    account = "spender"
    grant_fast_seconds(account, 0.001 - fast_seconds_left(account))
    submit("spend it", tier="fast", account=account, **SMALL).get(timeout=60)
    assert fast_seconds_left(account) <= 0
    _view_has(lambda v: account in v.exhausted)
    out = submit("no fast left", tier="fast", account=account, **SMALL).get(timeout=60)
    assert out["lane"] == "relaxed" and out["downgrade_reason"] == "fast_time_exhausted"
    assert out["downgraded_from"] == "fast"
    left = fast_seconds_left(account)
    assert left <= 0  # a relaxed run is not charged
    grant_fast_seconds(account, 60)
    _view_has(lambda v: account not in v.exhausted)
    assert submit("fast again", tier="fast", account=account, **SMALL).get(timeout=60)["lane"] \
        == "fast"


def test_full_lanes_spill_down_and_a_full_relaxed_lane_refuses(cluster, monkeypatch):
    cache = snapshot_cache()
    monkeypatch.setattr(cache, "max_depth", {"fast": 2, "standard": 2, "relaxed": 3})
    gate = new_gate()
    blocker = submit(f"gate:{gate} hold", model="flaky", tier="fast", **SMALL)
    wait_at_gate(blocker, gate)
    started = time.time()
    try:
        _view_has(lambda v: v.at > started)  # a snapshot taken with the blocker running
        lanes = [submit(f"j{i}", tier="fast", **SMALL) for i in range(7)]
        with pytest.raises(LaneFull) as caught:
            submit("one too many", tier="fast", **SMALL)
        assert caught.value.lane == "relaxed" and caught.value.retry_after_s >= 1
    finally:
        open_gate(gate)
    results = [r.get(timeout=60) for r in lanes]
    assert [r["lane"] for r in results] == ["fast"] * 2 + ["standard"] * 2 + ["relaxed"] * 3
    assert {r.get("downgrade_reason") for r in results[2:]} == {"lane_full"}


def test_retries_walk_down_the_lanes_into_the_dead_letter_list(cluster, clean_redis):
    out = submit("transient:2 twice", model="flaky", tier="fast", seed=4, **SMALL).get(timeout=60)
    assert out["attempts"] == 3 and out["lane"] == "relaxed"
    assert out["downgraded_from"] == "fast" and out["downgrade_reason"] == "retry"
    doomed = submit("transient:4 always", model="flaky", tier="fast", seed=5, **SMALL)
    with pytest.raises(JobFailed, match="gave up after 4 attempts"):
        doomed.get(timeout=60)
    (dead,) = [d for d in dead_jobs(clean_redis) if d["job_id"] == doomed.id]
    assert dead["reason"] == "retries_exhausted" and dead["attempts"] == 4
    assert dead["route"]["lane"] == "relaxed" and "TransientJobError" in dead["traceback"]
    again = requeue(clean_redis, doomed.id)  # the fifth run of that prompt succeeds
    assert again.id == doomed.id and again.get(timeout=60)["attempts"] == 1
    assert not dead_jobs(clean_redis)


def test_relaxed_lane_serves_light_users_first_but_never_starves_heavy_ones(cluster,
                                                                         clean_redis):
    _make_heavy(clean_redis, "heavy")
    gate = new_gate()
    blocker = submit(f"gate:{gate} hold", model="flaky", tier="fast", **SMALL)
    wait_at_gate(blocker, gate)
    heavy = [submit(f"h{i}", tier="relaxed", account="heavy", **SMALL) for i in range(4)]
    light = [submit(f"l{i}", tier="relaxed", account="light", **SMALL) for i in range(4)]
    open_gate(gate)
    started = {r.id: r.get(timeout=60)["started_at"] for r in heavy + light}
    assert max(started[r.id] for r in light) < min(started[r.id] for r in heavy)


#: What a heavy account's job may wait beyond the aging bound: a beat round (1 s), the
#: lighter job then running and the beat/worker/Redis round trips on a loaded machine.
AGING_TOLERANCE_S = 3.0
#: The newcomers' stream is fed until the heavy job starts or has waited this long
#: (past the bound: the assertion then fails), and never beyond this many jobs.
STREAM_FOR_S = AGING_S + AGING_TOLERANCE_S + 1.0
STREAM_CAP = 400


def test_a_heavy_users_job_runs_within_the_aging_bound(cluster, clean_redis):
    """A heavy account's relaxed job is never held past the aging bound (plus a
    tolerance) while lighter accounts' jobs keep arriving ahead of it.

    The lighter accounts' stream is gated: each newcomer job holds the one
    worker at its gate until the test lets it go, and the next newcomer is
    queued before it does. So whenever the worker takes its next job, a
    lighter account's job is queued ahead of the heavy one, on any machine,
    for as long as the heavy job waits (up to ``STREAM_FOR_S``): only aging
    can let it through. Every job submitted must come back.
    """
    _make_heavy(clean_redis, "hog")
    stream: list[tuple[object, str]] = []  # (result, gate) per newcomer job, in order

    def newcomer() -> None:
        gate, n = new_gate(), len(stream)
        stream.append((submit(f"gate:{gate} s{n}", model="flaky", tier="relaxed",
                              account=f"newcomer{n}", **SMALL), gate))

    try:
        newcomer()
        wait_at_gate(*stream[0])  # the worker is busy with a lighter account's job
        hog = submit("waiting", tier="relaxed", account="hog", **SMALL)
        stop_feeding = time.monotonic() + STREAM_FOR_S
        newcomer()  # submitted after the heavy job, queued ahead of it
        while (not hog.ready() and time.monotonic() < stop_feeding
               and len(stream) < STREAM_CAP):
            # stream[-2] holds the worker at its gate; stream[-1] waits ahead of the hog
            open_gate(stream[-2][1])
            wait_at_gate(*stream[-1])  # the worker took it (after the hog, if aged)
            newcomer()
    finally:
        for _, gate in stream:
            open_gate(gate)
    out = hog.get(timeout=60)
    returned = [result.get(timeout=60) for result, _ in stream]
    # every job submitted came back, each its own, from the relaxed lane
    assert [r["job_id"] for r in [out, *returned]] == [hog.id, *(r.id for r, _ in stream)]
    assert {r["lane"] for r in [out, *returned]} == {"relaxed"}
    submitted_at, started_at = out["started_at"] - out["queued_ms"] / 1000, out["started_at"]
    starts = [r["started_at"] for r in returned]
    served_ahead = sum(submitted_at < s < started_at for s in starts)
    # lighter accounts went first while the hog waited, and held it until it aged
    assert served_ahead >= 1, f"no lighter account's job ran ahead of the heavy one: {out}"
    assert out["queued_ms"] >= AGING_S * 1000, f"the heavy job was not held until it aged: {out}"
    assert out["queued_ms"] <= (AGING_S + AGING_TOLERANCE_S) * 1000, (
        f"a heavy account's relaxed job waited {out['queued_ms'] / 1000:.1f}s, past the "
        f"{AGING_S:g}s aging bound + {AGING_TOLERANCE_S:g}s, while {served_ahead} of "
        f"{len(stream)} lighter accounts' jobs ran ahead of it")
    # and the bound was what let it through: a lighter job was still queued then
    assert max(starts) > started_at, (
        f"the stream ran out ({len(stream)} jobs) before the heavy job started")
