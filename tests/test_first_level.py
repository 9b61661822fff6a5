"""Standard's first level (``routing.names.FIRST_STEPS``): what a first-level job would
wait for on each worker, measured by beat and carried by the compact snapshot; the
placement that sends such a job (and a fast one) where no first-level work is; and the
news that tells a heavier run to step aside for it, on the test Redis. The step aside
itself runs on real workers in tests/test_preempt.py."""
from __future__ import annotations

import json
import time

import pytest
from conftest import SMALL, bind_own_queues

from beat.heartbeat import lane_depths
from gpu_worker.preempt import first_lists
from routing.compact import fast_work, first_work, split
from routing.fleet import build_fleet, measure, policy_view
from routing.hashring import ring
from routing.names import FAST, FIRST_STEPS, RELAXED, STANDARD, first_level, worker_queue
from routing.placement import home
from routing.policy import PolicyView, decide
from routing.snapshot import SnapshotCache
from tasks.broker.keys import (
    HEAVIER_SCORE,
    PREEMPTIBLE_KEY,
    PRIORITY_SEP,
    fast_news_channel,
    preemptible_score,
)
from tasks.jobs.schema import validate
from tasks.worker.generate import generate


def test_the_first_level_is_standard_step_0_and_its_least_used_accounts_level():
    assert FIRST_STEPS == (0, 1)
    assert first_level(STANDARD, 0) and first_level(STANDARD, 1) and first_level(STANDARD, None)
    assert not first_level(STANDARD, 3) and not first_level(RELAXED, 1)
    assert not first_level(FAST, 0)
    assert first_lists("standard.gpu0@a") == ("standard.gpu0@a",
                                              f"standard.gpu0@a{PRIORITY_SEP}1")


def test_beat_counts_each_workers_first_level_jobs_of_its_own_queue():
    own = worker_queue(STANDARD, "w")
    lengths = {FAST: {worker_queue(FAST, "w"): 2}, RELAXED: {worker_queue(RELAXED, "w"): 4},
               STANDARD: {own: 1, f"{own}{PRIORITY_SEP}1": 3, f"{own}{PRIORITY_SEP}3": 5,
                          f"standard{PRIORITY_SEP}1": 7}}
    workers = {"w": {}, "x": {}}
    lane_depths(None, workers, lengths)
    assert workers["w"] == {"queued": 15, "queued_fast": 2, "queued_first": 4}
    assert workers["x"] == {"queued": 0, "queued_fast": 0, "queued_first": 0}


def test_first_work_adds_first_level_runs_and_queued_jobs_to_the_fast_work():
    worker = {"in_flight": {STANDARD: 1}, "in_flight_first": 1, "queued_fast": 1,
              "queued_first": 2}
    assert fast_work(worker) == 1 and first_work(worker) == 4
    heavy = {"in_flight": {STANDARD: 1}, "in_flight_first": 0, "queued_first": 0}
    assert first_work(heavy) == 0  # a heavier run steps aside: nothing to wait for
    loading = {"in_flight": {}, "loading_models": ["m"]}
    assert first_work(loading) == 1  # a load is not preempted


def _snapshot() -> dict:
    workers = {
        "light": {"alive": True, "in_flight": {STANDARD: 1}, "in_flight_first": 1,
                  "warm_models": ["m"], "memory_mb": 4},
        "heavy": {"alive": True, "in_flight": {STANDARD: 1}, "in_flight_first": 0,
                  "warm_models": ["m"], "memory_mb": 4},
        "fast": {"alive": True, "in_flight": {FAST: 1}, "warm_models": ["m"], "memory_mb": 4},
        "other": {"alive": True, "in_flight": {}, "warm_models": ["n"], "memory_mb": 4},
    }
    return {"at": time.time(), "workers": workers, "lanes": {}, "policy": {}}


def test_the_compact_snapshot_carries_first_work_per_worker():
    compact, members = split(_snapshot())
    view = policy_view(measure(compact, build_fleet(members)), 0.25)
    assert dict(view.first_loads) == {"fast": 1, "heavy": 0, "light": 1, "other": 0}
    assert dict(view.fast_loads) == {"fast": 1, "heavy": 0, "light": 0, "other": 0}


def test_a_first_level_job_goes_where_a_heavier_run_would_step_aside_for_it():
    hosts = ["light", "heavy", "fast", "other"]
    hash_ring = ring(hosts)
    warm = {"light": ("m",), "heavy": ("m",), "fast": ("m",), "other": ("n",)}
    loads = {"light": 1, "heavy": 1, "fast": 1, "other": 0}
    first = {"light": 1, "heavy": 0, "fast": 1, "other": 0}
    fast = {"light": 0, "heavy": 0, "fast": 1, "other": 0}
    for front in ("light", "fast", "heavy"):  # whichever is the model's home
        assert home("m", hash_ring, loads, 0.25, warm, first=front, first_loads=first) == "heavy"
        assert home("m", hash_ring, loads, 0.25, warm, first=front, fast_loads=fast,
                    first_loads=first) == "heavy"  # a fast job: not the light run either
    busy = {**first, "heavy": 1}  # every holder has work it would wait for
    assert home("m", hash_ring, loads, 0.25, warm, first="light", fast_loads=fast,
                first_loads=busy) == "light"  # a fast job still preempts a first-level run
    assert home("m", hash_ring, {**loads, "heavy": 9}, 0.25, warm, first="light",
                fast_loads=fast) in ("light", "heavy")  # no first work known: as before


def test_decide_places_a_least_used_accounts_standard_job_by_first_work():
    hosts = ("light", "heavy")
    view = PolicyView(ring=ring(list(hosts)), loads={"light": 0, "heavy": 5},
                      warm={"light": ("m",), "heavy": ("m",), "other": ()},
                      first_loads={"light": 1, "heavy": 0}, levels={"busy": 2},
                      homes={"m": "light"})
    view = view.but(ring=ring(["light", "heavy", "other"]),
                    loads={"light": 0, "heavy": 5, "other": 0},
                    first_loads={"light": 1, "heavy": 0, "other": 0})
    assert decide(STANDARD, "newcomer", True, view, "m").node == "heavy"
    assert decide(STANDARD, "busy", True, view, "m").node == "light"  # a later level
    assert decide(RELAXED, "newcomer", True, view, "m").node == "light"


def test_a_first_level_send_counts_in_the_routers_first_work_until_measured():
    snapshot = _snapshot()
    cache = SnapshotCache(lambda: json.dumps(snapshot), refresh_s=0.5, stale_s=10.0,
                          max_depth=dict.fromkeys((FAST, STANDARD, RELAXED), 99),
                          clock=lambda: snapshot["at"])
    cache._thread = object()  # refreshed by hand
    cache.refresh()
    cache.note_sent(STANDARD, "heavy", "m", first=True)
    cache.note_sent(STANDARD, "other", "n")  # a later level's: not first work
    cache.note_sent(FAST, "other", "n")
    view = cache.view()
    assert view.first_loads["heavy"] == 1 and view.first_loads["other"] == 1
    assert view.fast_loads["heavy"] == 0 and view.fast_loads["other"] == 1


@pytest.mark.parametrize("step, told", [(0, True), (1, True), (3, False), (9, False)])
def test_a_first_level_job_in_a_workers_own_queue_tells_that_worker(
        clean_redis, app, step, told):
    host = "gpu0@news"
    own = worker_queue(STANDARD, host)
    bind_own_queues(app, own)
    news = clean_redis.pubsub()
    news.subscribe(fast_news_channel(host))
    news.get_message(timeout=1.0)  # the subscription's confirmation
    _publish(own, step)
    heard = news.get_message(timeout=1.0 if told else 0.3)
    news.close()
    key = own if step == 0 else f"{own}{PRIORITY_SEP}{step}"
    assert (heard is not None and heard["data"] == key.encode()) == told


def test_a_shared_first_level_job_tells_the_heaviest_run_and_never_a_first_level_one(
        clean_redis, app):
    light, heavy = "gpu0@light", "gpu1@heavy"
    clean_redis.zadd(PREEMPTIBLE_KEY, {light: preemptible_score(STANDARD, 1, time.time())})
    assert preemptible_score(STANDARD, 1, time.time()) < HEAVIER_SCORE \
        <= preemptible_score(STANDARD, 3, 0.0) < preemptible_score(RELAXED, 0, 0.0)
    channels = {host: clean_redis.pubsub() for host in (light, heavy)}
    for host, news in channels.items():
        news.subscribe(fast_news_channel(host))
        news.get_message(timeout=1.0)
    _publish(STANDARD, 1)
    assert channels[light].get_message(timeout=0.3) is None  # nothing heavier to stop
    assert clean_redis.zscore(PREEMPTIBLE_KEY, light) is not None  # left in the index
    clean_redis.zadd(PREEMPTIBLE_KEY, {heavy: preemptible_score(STANDARD, 9, time.time())})
    _publish(STANDARD, 1)
    heard = channels[heavy].get_message(timeout=1.0)
    assert heard is not None and heard["data"] == f"standard{PRIORITY_SEP}1".encode()
    assert clean_redis.zscore(PREEMPTIBLE_KEY, heavy) is None  # told once: off the index
    for news in channels.values():
        news.close()


def _publish(queue: str, step: int) -> None:
    job = validate("p", tier=STANDARD, account="light", model="demo", seed=1, **SMALL)
    generate.apply_async(kwargs={"job": job.encode(),
                                 "route": {"lane": STANDARD, "requested_tier": STANDARD},
                                 "submitted_at": time.time()},
                         exchange=queue, routing_key=queue, priority=step)
