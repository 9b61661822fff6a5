"""The result cache and in-flight coalescing on a real worker and the session Redis.

GPU runs are counted from the per-job attempt counters the worker writes as a
run begins (before any result exists), and from the worker's served counter.
"""
from __future__ import annotations

import os
import threading
from collections import Counter

import pytest
from celery.exceptions import TaskRevokedError
from celery.exceptions import TimeoutError as ResultTimeout
from celery.result import AsyncResult
from conftest import SMALL, new_gate, vary, wait_at_gate, wait_until

import tasks.broker.enqueue as enqueue_module
from routing.names import LANES, STATS_COMMAND
from routing.policy import FAST_TIME_EXHAUSTED, RETRY, PolicyView
from tasks import submit
from tasks.broker.keys import (CACHE_LRU_KEY, PREFIX, attempts_key, cache_entry_key, lane_keys,
                               run_key)
from tasks.errors import ConfigError, JobFailed
from tasks.jobs.cache import Sightings, digest
from tasks.settings import load
from tests.flaky_model import open_gate

pytestmark = pytest.mark.cluster
TTL_S, MAX_ENTRIES = 5, 3
CLUSTER_ENV = {"GPULANES_CACHE_TTL_S": str(TTL_S),
               "GPULANES_CACHE_MAX_ENTRIES": str(MAX_ENTRIES)}


@pytest.fixture(scope="module")
def cluster(cluster_factory):
    return cluster_factory(workers=1, env=CLUSTER_ENV)


def entry_key(prompt: str, seed: int, model: str = "demo") -> str:
    return cache_entry_key(digest({"model": model, "prompt": prompt, "seed": seed,
                                   "width": SMALL["width"], "height": SMALL["height"],
                                   "steps": SMALL["steps"]}))


def gpu_runs(client) -> int:
    """Runs begun on any worker since this test's Redis was flushed."""
    return sum(int(client.get(key) or 0) for key in client.scan_iter(attempts_key("*")))


def served(app) -> int:
    (answer,) = app.control.broadcast(STATS_COMMAND, reply=True, timeout=2.0, limit=1)
    return next(iter(answer.values()))["served"]


def revoked_on_worker(app, job_id: str) -> bool:
    replies = app.control.inspect(timeout=1.0, limit=1).revoked() or {}
    return any(job_id in ids for ids in replies.values())


def run(prompt: str, seed: int, **kwargs) -> dict:
    return submit(prompt, seed=seed, **SMALL, **kwargs).get(timeout=60)


def admit(prompt: str, seed: int = 1) -> dict:
    """Two sightings, two runs: the second run's result enters the cache."""
    assert run(prompt, seed)["cached"] is False
    assert run(prompt, seed)["cached"] is False
    return run(prompt, seed)


def lanes_empty(client) -> bool:
    return all(client.llen(key) == 0 for lane in LANES for key in lane_keys(lane))


# --- pure parts ------------------------------------------------------------------------
def test_digest_covers_what_makes_the_pixels_and_nothing_else():
    job = {"model": "demo", "prompt": "p", "seed": 1, "steps": 4, "width": 64, "height": 64,
           "tier": "fast", "account": "a"}
    assert digest(job) == digest({**job, "tier": "relaxed", "account": "b"})
    for field, other in (("model", "demo-0"), ("prompt", "q"), ("seed", 2), ("steps", 5),
                         ("width", 72), ("height", 72)):
        assert digest({**job, field: other}) != digest(job), field


def test_bloom_false_positive_rate_within_its_bound_at_capacity():
    capacity, error_rate = 20_000, 0.01
    seen = Sightings(capacity, error_rate)
    keys = [digest({"model": "demo", "prompt": f"kept {i}", "seed": i, "steps": 4,
                    "width": 64, "height": 64}) for i in range(capacity)]
    for key in keys:
        seen.seen_before(key)
    assert all(key in seen for key in keys)  # a Bloom filter never forgets
    probes = [digest({"model": "demo", "prompt": f"fresh {i}", "seed": i, "steps": 4,
                      "width": 64, "height": 64}) for i in range(50_000)]
    rate = sum(key in seen for key in probes) / len(probes)
    assert 0 < rate <= error_rate, rate


def test_sightings_stay_bounded_and_last_at_least_capacity_more():
    seen = Sightings(1000, 0.01)
    assert not seen.seen_before("first") and seen.seen_before("first")
    for i in range(1000):  # capacity more sightings: "first" is still remembered
        seen.seen_before(f"other {i}")
    assert "first" in seen
    for i in range(1000, 3000):  # two generations later it is gone, and so is the memory
        seen.seen_before(f"other {i}")
    assert "first" not in seen
    assert len(seen._new) + len(seen._old) <= 2000


def test_bad_cache_setting_names_its_variable(monkeypatch):
    monkeypatch.setenv("GPULANES_CACHE_MAX_ENTRIES", "none")
    with pytest.raises(ConfigError, match="GPULANES_CACHE_MAX_ENTRIES"):
        load()
    with pytest.raises(ConfigError, match="GPULANES_CACHE_TTL_S"):
        load(cache_ttl_s="0")


# --- the cache -------------------------------------------------------------------------
def test_admitted_on_second_sighting_then_served_without_a_gpu(cluster, clean_redis, app):
    first = run("admission", 11)
    assert not clean_redis.exists(entry_key("admission", 11))  # one sighting: kept out
    second = run("admission", 11, tier="fast")
    assert clean_redis.exists(entry_key("admission", 11))
    hit = submit("admission", seed=11, tier="relaxed", account="bob", **SMALL)
    third = hit.get(timeout=10)
    assert (first["cached"], second["cached"], third["cached"]) == (False, False, True)
    assert gpu_runs(clean_redis) == 2 and not clean_redis.exists(attempts_key(hit.id))
    assert lanes_empty(clean_redis)
    assert third["image"] == second["image"] and os.path.isfile(third["image"])
    assert third["job_id"] == hit.id and third["source_job_id"] == second["job_id"]
    assert third["requested_tier"] == "relaxed" and third["attempts"] == 0
    assert AsyncResult(hit.id, app=app).get(timeout=10) == third  # stored under its id too


def test_a_caller_sees_its_result_only_once_its_run_is_closed_to_joiners(cluster, clean_redis):
    """A run others may join is settled (cached, closed to joiners) before its result
    is announced: a caller that submits the same job again at once is served from the
    cache, never joined to the finished run. Redis' own order of commands (MONITOR)
    says which came first."""
    seen: list[str] = []

    def listen() -> None:
        try:
            for command in monitor.listen():
                seen.append(command["command"])
        except Exception:  # noqa: BLE001  disconnected below: the record is complete
            return

    with clean_redis.monitor() as monitor:
        threading.Thread(target=listen, daemon=True).start()
        job = submit("closed first", seed=3, **SMALL)
        job.get(timeout=60)
        wait_until(lambda: any(c.startswith("PUBLISH celery-task-meta-") for c in seen),
                   what="the result's announcement in MONITOR's stream")
        monitor.connection.disconnect()
    settled = next(i for i, c in enumerate(seen)
                   if c.startswith(f"HSET {run_key(job.id)} settled"))
    announced = next(i for i, c in enumerate(seen)
                     if c.startswith(f"PUBLISH celery-task-meta-{job.id}"))
    assert settled < announced, [c[:150] for c in seen[announced - 3:settled + 2]]


def test_jobs_without_a_seed_are_never_cached_or_coalesced(cluster, clean_redis):
    outs = [r.get(timeout=60) for r in [submit("unseeded", **SMALL) for _ in range(3)]]
    outs.append(run("unseeded", outs[0]["seed"]))  # the drawn seed, now given: 1st sighting
    assert [o["cached"] for o in outs] == [False] * 4
    assert gpu_runs(clean_redis) == 4
    assert not clean_redis.exists(entry_key("unseeded", outs[0]["seed"]))


def test_cache_off_runs_every_job(cluster, clean_redis, monkeypatch):
    vary(monkeypatch, cache=False)
    outs = [r.get(timeout=60) for r in [submit("off", seed=3, **SMALL) for _ in range(3)]]
    outs.append(run("off", 3))
    assert [o["cached"] for o in outs] == [False] * 4 and gpu_runs(clean_redis) == 4
    assert not list(clean_redis.scan_iter(f"{PREFIX}:cache:*"))


def test_entry_expires_after_its_ttl(cluster, clean_redis):
    assert admit("short-lived")["cached"] is True
    key = entry_key("short-lived", 1)
    assert 0 < clean_redis.ttl(key) <= TTL_S
    wait_until(lambda: not clean_redis.exists(key), timeout_s=TTL_S + 10,
               what="the entry to expire")
    assert run("short-lived", 1)["cached"] is False
    assert gpu_runs(clean_redis) == 3


def test_size_budget_evicts_the_least_recently_hit(cluster, clean_redis):
    for name in ("a", "b", "c"):
        admit(f"lru {name}")
    assert run("lru a", 1)["cached"] is True  # a is hit again: b is now the oldest
    admit("lru d")
    present = {name for name in "abcd" if clean_redis.exists(entry_key(f"lru {name}", 1))}
    assert present == {"a", "c", "d"}
    assert clean_redis.zcard(CACHE_LRU_KEY) == MAX_ENTRIES
    assert run("lru b", 1)["cached"] is False


def test_a_vanished_artifact_is_a_miss(cluster, clean_redis):
    hit = admit("vanishing")
    os.remove(hit["image"])
    again = run("vanishing", 1)
    assert again["cached"] is False and os.path.isfile(again["image"])
    assert run("vanishing", 1)["image"] == again["image"]  # re-admitted, the new PNG
    assert gpu_runs(clean_redis) == 3


@pytest.mark.parametrize("damage", ["truncated", "overwritten"])
def test_a_damaged_artifact_is_a_miss(cluster, clean_redis, damage):
    hit = admit(f"damaged {damage}")
    assert hit["bytes"] == os.path.getsize(hit["image"]) and len(hit["sha256"]) == 64
    data = open(hit["image"], "rb").read()
    with open(hit["image"], "wb") as png:  # same size, other bytes; or half of it
        png.write(data[: len(data) // 2] if damage == "truncated" else data[::-1])
    again = run(f"damaged {damage}", 1)
    assert again["cached"] is False and open(again["image"], "rb").read() == data
    assert gpu_runs(clean_redis) == 3


# --- coalescing ------------------------------------------------------------------------
def test_identical_submits_in_flight_share_one_run(cluster, clean_redis, app):
    gate, before = new_gate(), served(app)
    prompt = f"gate:{gate} shared"
    leader = submit(prompt, model="flaky", seed=5, tier="fast", **SMALL)
    wait_at_gate(leader, gate)
    followers = [submit(prompt, model="flaky", seed=5, tier=tier, **SMALL)
                 for tier in ("fast", "standard", "relaxed", "standard")]
    open_gate(gate)
    outs = [r.get(timeout=60) for r in (leader, *followers)]
    assert len({o["image"] for o in outs}) == 1
    assert [o["cached"] for o in outs] == [False] + [True] * 4
    assert all(o["coalesced"] and o["source_job_id"] == leader.id for o in outs[1:])
    assert [o["job_id"] for o in outs] == [r.id for r in (leader, *followers)]
    assert [o["requested_tier"] for o in outs[1:]] == ["fast", "standard", "relaxed", "standard"]
    assert gpu_runs(clean_redis) == 1
    wait_until(lambda: served(app) >= before + 1, what="the worker to count its run")
    assert served(app) == before + 1


def test_a_caller_revoking_or_timing_out_leaves_the_run_to_the_others(cluster, clean_redis,
                                                                      app):
    gate = new_gate()
    prompt = f"gate:{gate} stay"
    leader = submit(prompt, model="flaky", seed=6, **SMALL)
    wait_at_gate(leader, gate)
    quitter, stayer = (submit(prompt, model="flaky", seed=6, **SMALL) for _ in range(2))
    quitter.revoke()
    wait_until(lambda: revoked_on_worker(app, quitter.id), what="the revoke to arrive")
    with pytest.raises(ResultTimeout):
        stayer.get(timeout=0.2)  # a caller's timeout: the run goes on
    open_gate(gate)
    image = leader.get(timeout=60)["image"]
    assert stayer.get(timeout=60)["image"] == image
    with pytest.raises(TaskRevokedError):
        quitter.get(timeout=30)
    assert gpu_runs(clean_redis) == 1


def test_a_revoked_queued_leader_hands_its_run_to_a_follower(cluster, clean_redis, app):
    gate = new_gate()
    blocker = submit(f"gate:{gate} hold the worker", model="flaky", **SMALL)
    wait_at_gate(blocker, gate)
    leader = submit("handed over", seed=8, **SMALL)  # queued behind the blocker
    heirs = [submit("handed over", seed=8, tier=tier, **SMALL)
             for tier in ("relaxed", "standard")]
    leader.revoke()
    wait_until(lambda: revoked_on_worker(app, leader.id), what="the revoke to arrive")
    open_gate(gate)
    outs = [r.get(timeout=60) for r in heirs]
    with pytest.raises(TaskRevokedError):
        leader.get(timeout=30)
    assert outs[0]["image"] == outs[1]["image"]
    assert [o["cached"] for o in outs] == [True, False]  # the heir: the fastest follower
    assert outs[0]["source_job_id"] == heirs[1].id
    assert gpu_runs(clean_redis) == 2  # the blocker and one run for both heirs
    blocker.get(timeout=30)


def test_a_running_leader_revoked_runs_on_for_its_followers(cluster, clean_redis, app):
    """Its own caller revoked it mid-run, another still waits: the run is not stopped and
    started again by an heir; the follower gets its image from it, the leader REVOKED."""
    gate = new_gate()
    prompt = f"gate:{gate} keep going"
    leader = submit(prompt, model="flaky", seed=9, **SMALL)
    wait_at_gate(leader, gate)  # running, inside the model
    follower = submit(prompt, model="flaky", seed=9, **SMALL)
    leader.revoke()
    wait_until(lambda: revoked_on_worker(app, leader.id), what="the revoke to arrive")
    open_gate(gate)
    out = follower.get(timeout=60)
    assert out["coalesced"] and out["source_job_id"] == leader.id
    with pytest.raises(TaskRevokedError):
        leader.get(timeout=30)
    assert gpu_runs(clean_redis) == 1  # one run served the follower: nothing ran again


def test_a_faster_caller_never_waits_in_a_slower_run(cluster, clean_redis):
    gate = new_gate()
    blocker = submit(f"gate:{gate} hold the worker", model="flaky", **SMALL)
    wait_at_gate(blocker, gate)
    slow = submit("in a hurry", seed=4, tier="relaxed", **SMALL)
    fast = submit("in a hurry", seed=4, tier="fast", **SMALL)  # leads a run of its own
    later = submit("in a hurry", seed=4, tier="standard", **SMALL)  # joins the fast run
    open_gate(gate)
    slow_out, fast_out, later_out = (r.get(timeout=60) for r in (slow, fast, later))
    assert slow_out["cached"] is False and fast_out["cached"] is False
    assert fast_out["lane"] == "fast" and fast_out["started_at"] < slow_out["started_at"]
    assert later_out["cached"] and later_out["source_job_id"] == fast.id
    assert gpu_runs(clean_redis) == 3
    blocker.get(timeout=30)


def test_a_failed_run_fails_every_follower(cluster, clean_redis):
    gate = new_gate()
    blocker = submit(f"gate:{gate} hold the worker", model="flaky", **SMALL)
    wait_at_gate(blocker, gate)
    doomed = [submit("bug shared", model="flaky", seed=9, tier=tier, **SMALL)
              for tier in ("fast", "standard", "relaxed")]
    open_gate(gate)
    for result in doomed:
        with pytest.raises(JobFailed, match="simulated bug"):
            result.get(timeout=60)
    assert gpu_runs(clean_redis) == 2
    again = submit("bug shared", model="flaky", seed=9, **SMALL)  # nothing left to join
    with pytest.raises(JobFailed):
        again.get(timeout=60)
    assert gpu_runs(clean_redis) == 3
    blocker.get(timeout=30)


def test_a_fast_job_never_joins_a_run_sent_to_a_slower_lane(cluster, clean_redis, monkeypatch):
    gate = new_gate()
    blocker = submit(f"gate:{gate} hold the worker", model="flaky", **SMALL)
    wait_at_gate(blocker, gate)
    # the router knows account "spent" has no fast time left: its fast job waits in relaxed
    monkeypatch.setattr(enqueue_module, "TIER_LANES_ONLY",
                        PolicyView(exhausted=frozenset({"spent"})))
    leader = submit("lane not tier", seed=12, tier="fast", account="spent", **SMALL)
    relaxed = submit("lane not tier", seed=12, tier="relaxed", account="rich", **SMALL)
    fast = submit("lane not tier", seed=12, tier="fast", account="rich", **SMALL)
    open_gate(gate)
    leader_out, relaxed_out, fast_out = (r.get(timeout=60) for r in (leader, relaxed, fast))
    assert (leader_out["lane"], leader_out["downgrade_reason"]) == ("relaxed",
                                                                  FAST_TIME_EXHAUSTED)
    assert relaxed_out["cached"] and relaxed_out["source_job_id"] == leader.id
    assert fast_out["cached"] is False and fast_out["lane"] == "fast"
    assert fast_out["started_at"] < leader_out["started_at"]
    assert gpu_runs(clean_redis) == 3
    blocker.get(timeout=30)


def test_a_fast_job_never_joins_a_run_retried_down_a_lane(cluster, clean_redis):
    gate = new_gate()
    prompt = f"transient:1 gate:{gate} retried lower"  # fails once, then waits at the gate
    leader = submit(prompt, model="flaky", seed=13, tier="fast", **SMALL)
    wait_at_gate(leader, gate)  # its retry, one lane down, runs
    assert clean_redis.hget(run_key(leader.id), "rank") == b"1"
    standard = submit(prompt, model="flaky", seed=13, tier="standard", **SMALL)
    fast = submit(prompt, model="flaky", seed=13, tier="fast", **SMALL)
    open_gate(gate)
    leader_out, standard_out, fast_out = (r.get(timeout=60) for r in (leader, standard, fast))
    assert (leader_out["lane"], leader_out["downgrade_reason"]) == ("standard", RETRY)
    assert standard_out["cached"] and standard_out["source_job_id"] == leader.id
    assert fast_out["cached"] is False and fast_out["lane"] == "fast"
    assert gpu_runs(clean_redis) == 3  # the leader twice, the fast job once


def test_followers_of_a_failed_run_are_told_once(cluster, clean_redis, app):
    gate = new_gate()
    blocker = submit(f"gate:{gate} hold the worker", model="flaky", **SMALL)
    wait_at_gate(blocker, gate)
    leader, *followers = (submit("bug told once", model="flaky", seed=14, tier=tier, **SMALL)
                          for tier in ("fast", "standard", "relaxed"))
    writes = clean_redis.pubsub()
    writes.subscribe(*(app.backend.get_key_for_task(r.id) for r in followers))
    open_gate(gate)
    for result in (leader, *followers):
        with pytest.raises(JobFailed, match="simulated bug"):
            result.get(timeout=60)
    # the worker's only thread finishes the leader (its failure signal too) before this
    submit("after the failure", **SMALL).get(timeout=60)
    told = Counter()
    while message := writes.get_message(timeout=0.5):  # None: nothing more within 0.5 s
        told[message["channel"]] += message["type"] == "message"
    writes.close()
    assert sorted(told.values()) == [1, 1]
    blocker.get(timeout=30)

