"""Load: a burst of submits from several processes against a small cluster.

The quick form of the soak ``tests/soak/load.py``: 2,000 submits from 3 spawned
processes, as fast as they can, against two CPU workers and beat, with lane
limits small enough that the burst must fill them. Every submit is either
accepted or refused with ``LaneFull`` (nothing else), refusals come only once
the relaxed lane is full, no lane ever holds more than its limit (the publish
checks it in Redis, so the submitters together cannot pass it), every accepted
job completes, and neither Redis nor the submitters grow beyond generous bounds.
"""
from __future__ import annotations

import pytest

from tasks.settings import settings
from tests.soak.load import accepted_ids, run_burst
from tests.soak.load_probe import Probe, collect
from tests.soak.load_report import moved_into

JOBS, PROCS = 2000, 3
#: Small enough that a 2,000-job burst fills every lane.
LIMITS = {"fast": 40, "standard": 100, "relaxed": 400}
MB = 1024 * 1024


@pytest.fixture(scope="module")
def cluster(cluster_factory):
    return cluster_factory(workers=2, beat=True)


@pytest.fixture(scope="module")
def soaked(cluster, app, redis_server):
    """Run the burst once (the submitters inherit the limits) and wait for its jobs."""
    client = redis_server.client()
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("GPULANES_MAX_DEPTH", ",".join(f"{lane}={n}" for lane, n in LIMITS.items()))
        probe = Probe(client, cluster.hostnames, {}).start()
        try:
            burst = run_burst(JOBS, PROCS, timeout_s=120)
            fate = collect(app, client, accepted_ids(burst), deadline_s=90)
        finally:
            probe.stop()
    return burst, fate, probe


@pytest.mark.cluster
def test_burst_is_accepted_or_refused_and_every_accepted_job_completes(soaked):
    burst, fate, probe = soaked
    errors = [o.first_error for o in burst.outcomes if o.errors]
    assert not errors, errors[0]
    refusals = [key for o in burst.outcomes for key in o.refused.elements()]
    accepted = accepted_ids(burst)
    assert len(accepted) + len(refusals) == JOBS
    assert refusals, "a burst of 2,000 never filled lanes limited to 540 jobs"
    assert {key.split("->")[1] for key in refusals} == {"relaxed"}
    peak = {lane: max(s.depths[lane] for s in probe.samples) for lane in LIMITS}
    assert peak["relaxed"] >= 0.9 * LIMITS["relaxed"], peak  # refused only when full
    assert not fate.failed and not fate.missing, (fate.failed, fate.missing[:5])
    assert set(fate.results) == set(accepted)
    # submits never pass a limit, whatever the other submitters do; only jobs
    # moved down by beat or retried (accepted long before) may go in above it
    moved_in = moved_into(fate.results.values())
    assert all(peak[lane] <= LIMITS[lane] + moved_in[lane] for lane in LIMITS), \
        (peak, moved_in)


@pytest.mark.cluster
def test_fast_jobs_in_the_fast_lane_start_within_its_budget(soaked):
    _, fate, _ = soaked
    waits_s = [r["queued_ms"] / 1000 for r in fate.results.values()
               if r["lane"] == "fast" and not r.get("cached")]
    assert waits_s and max(waits_s) <= settings.max_wait_s["fast"]


@pytest.mark.cluster
def test_memory_stays_bounded(soaked):
    burst, _, probe = soaked
    grew = max(s.used_memory for s in probe.samples) - probe.samples[0].used_memory
    assert grew < 64 * MB  # 2,000 jobs of a few kB each, queued or finished
    for outcome in burst.outcomes:
        rss_mb = {k: v / 1024 for k, v in outcome.rss_kb.items()}
        assert rss_mb["end"] - rss_mb["half"] < 25, rss_mb
        assert rss_mb["peak"] < 400, rss_mb


def test_a_router_without_snapshots_keeps_its_memory_bounded():
    """With beat down no snapshot ever arrives to settle the sends a router counts;
    sends older than the oldest snapshot it may route from must still be dropped."""
    from routing.snapshot import SnapshotCache

    now = [1000.0]
    cache = SnapshotCache(lambda: None, refresh_s=0.5, stale_s=5.0,
                          max_depth={"fast": 1, "standard": 1, "relaxed": 1},
                          clock=lambda: now[0])
    for n in range(20_000):  # 200 s of sends at 100/s
        now[0] += 0.01
        cache.note_sent("relaxed", None, "demo")
    assert len(cache._log) <= 501  # the last stale_s of them
    assert cache._sent["relaxed"] == len(cache._log)
