"""Any number of beats: one leads by a lease, every write of beat's is fenced by its
epoch, and a standby takes over from a killed or paused leader."""
from __future__ import annotations

import json
import os
import signal
import sys
import time

import pytest
from conftest import SMALL, STATE_DIR, wait_until

from beat.health import requeue_dead
from beat.heartbeat import expire_dead_letters, heartbeat, write_round
from beat.lease import Leadership
from beat.movers import enforce_deadlines
from gpu_worker.processes import spawn
from tasks.broker import handover, leader
from tasks.broker.keys import (
    BEAT_LEADER_KEY,
    DEAD_INDEX_KEY,
    DEAD_KEY,
    HELD_PREFIX,
    LANE_DEPTHS_KEY,
    LIST_DEPTHS_KEY,
    SNAPSHOT_KEY,
    lane_keys,
)
from tasks.broker.leader import fenced
from tasks.jobs.schema import validate
from tasks.settings import settings
from tasks.worker.generate import generate


def _stale(tier: str = "fast", waited_s: float = 10_000) -> str:
    """A job queued in ``tier``'s lane, long past its budget there."""
    job = validate("p", tier=tier, account="acct", model="demo", seed=1, downgradable=True,
                   **SMALL)
    return generate.apply_async(kwargs={
        "job": job.encode(), "route": {"lane": tier, "requested_tier": tier},
        "submitted_at": time.time() - waited_s}, queue=tier).id


def _ids(client, key: str) -> list[str]:
    return [json.loads(raw)["headers"]["id"] for raw in client.lrange(key, 0, -1)]


def test_one_beat_leads_and_a_new_lead_gets_a_new_epoch(clean_redis):
    first, second = Leadership(clean_redis, lease_s=0.3), Leadership(clean_redis, lease_s=0.3)
    assert first.renew() == 1 and second.renew() == 0
    assert first.renew() == 1  # renewed: still epoch 1
    assert leader.current(clean_redis) == (first.identity, 1)
    assert wait_until(second.renew, 5, what="the lease to lapse") == 2  # first paused
    assert first.renew() == 0 and first.epoch == 0
    second.stop()  # steps down: a standby leads at once, under a new epoch
    assert clean_redis.get(BEAT_LEADER_KEY) is None and first.renew() == 3


def test_every_write_of_an_old_leader_is_refused(clean_redis):
    old, new = Leadership(clean_redis, lease_s=0.3), Leadership(clean_redis, lease_s=0.3)
    assert old.renew() == 1
    assert wait_until(new.renew, 5, what="the lease to lapse") == 2
    stale = _stale()
    clean_redis.hset(DEAD_KEY, "dead-job", json.dumps({"failed_at": 1.0}))
    clean_redis.zadd(DEAD_INDEX_KEY, {"dead-job": 1.0})
    lost = _stale("standard", waited_s=0)
    gone = "gpu9@h/1/1.0"  # a worker that died holding it
    handover.take(clean_redis, gone, lane_keys("standard"), "t1")
    dead = {"gpu9@h": {"incarnation": gone, "alive": False, "started_at": 1.0}}
    clean_redis.set(SNAPSHOT_KEY, json.dumps({"at": 1.0}))
    with fenced(1):  # the paused leader wakes up and carries on with its round
        assert enforce_deadlines(clean_redis, settings.max_wait_s) == {"fast": 0, "standard": 0}
        assert not write_round(clean_redis, {"at": 2.0}, {"gpu0@h": {"alive": True}})
        assert expire_dead_letters(clean_redis, time.time()) == 0
        assert requeue_dead(clean_redis, dead, [gone], misses_allowed=2) == 0
    assert _ids(clean_redis, "fast") == [stale] and clean_redis.llen("standard") == 0
    assert json.loads(clean_redis.get(SNAPSHOT_KEY)) == {"at": 1.0}
    assert clean_redis.hexists(DEAD_KEY, "dead-job")
    assert [lost in raw for _, raw in handover.held(clean_redis, gone).values()] == [True]
    with fenced(2):  # the leader now does each of them
        assert enforce_deadlines(clean_redis, settings.max_wait_s)["fast"] == 1
        assert write_round(clean_redis, {"at": 2.0}, {"gpu0@h": {"alive": True}})
        assert expire_dead_letters(clean_redis, time.time()) == 1
        assert requeue_dead(clean_redis, dead, [gone], misses_allowed=2) == 1
    assert set(_ids(clean_redis, "standard")) == {stale, lost}
    assert handover.held(clean_redis, gone) == {}


def test_a_round_of_a_beat_that_does_not_lead_writes_nothing(clean_redis):
    assert Leadership(clean_redis).renew() == 1
    with fenced(7):  # an epoch that is not the current one
        assert heartbeat() == "another beat leads: nothing written"
    assert clean_redis.get(SNAPSHOT_KEY) is None


# --- real beat processes ----------------------------------------------------------------

@pytest.fixture
def beats():
    """Start beat processes; each is killed (and resumed first if paused) after the test."""
    started = []

    def start(name: str):
        log = open(STATE_DIR / f"{name}.log", "wb")  # this test's beat only
        proc = spawn([sys.executable, "-m", "celery", "-A", "tasks", "beat", "--loglevel",
                      "INFO"], env=os.environ.copy(), stdout=log, stderr=log,
                     stdin=open(os.devnull))
        started.append(proc)
        return proc

    start.started = started
    yield start
    for proc in started:
        if proc.poll() is None:
            proc.send_signal(signal.SIGCONT)
            proc.kill()
            proc.wait()


def _leader_pid(client) -> int | None:
    holder, _ = leader.current(client)
    return int(holder.split("/")[1]) if holder else None


def _snapshot(client) -> dict:
    return json.loads(client.get(SNAPSHOT_KEY) or "{}")


def _fail_over(client, beats, how: signal.Signals) -> tuple[float, float, int]:
    """Two beats; ``how`` hits the leader while stale jobs keep arriving. Returns (seconds
    until the standby led, the oldest snapshot a router could have read, the old epoch)."""
    first = beats("beat-first")
    wait_until(lambda: _leader_pid(client) == first.pid, 60, what="the first beat to lead")
    second = beats("beat-second")
    wait_until(lambda: _snapshot(client).get("at"), 30, what="a snapshot")
    wait_until(lambda: b"stands by" in (STATE_DIR / "beat-second.log").read_bytes(), 60,
               what="the second beat to ask for the lead and stand by")
    assert _leader_pid(client) == first.pid
    old_epoch = leader.current(client)[1]
    os.kill(first.pid, how)
    hit, oldest_s, led_s = time.monotonic(), 0.0, None
    while time.monotonic() - hit < (8 if led_s is None else led_s + 3):  # its rounds too
        oldest_s = max(oldest_s, time.time() - _snapshot(client)["at"])
        if led_s is None and _leader_pid(client) == second.pid:
            led_s = time.monotonic() - hit
        time.sleep(0.05)
    assert led_s is not None, "the standby never led"
    print(f"{how.name}: the standby led after {led_s:.2f}s; oldest snapshot {oldest_s:.2f}s")
    return led_s, oldest_s, old_epoch


@pytest.mark.cluster
def test_a_killed_leader_is_replaced_within_5s_and_no_job_moves_twice(clean_redis, beats):
    jobs = [_stale() for _ in range(20)]
    led_s, oldest_s, _ = _fail_over(clean_redis, beats, signal.SIGKILL)
    jobs += [_stale() for _ in range(20)]  # moved by the new leader
    wait_until(lambda: clean_redis.llen("fast") == 0, 10, what="every stale job moved")
    assert led_s < 5, f"the standby led after {led_s:.1f}s"
    assert oldest_s < settings.snapshot_stale_s, f"routers saw a {oldest_s:.1f}s old snapshot"
    assert sorted(_ids(clean_redis, "standard")) == sorted(jobs)  # each once, none lost
    assert not clean_redis.keys(HELD_PREFIX + "*")  # none taken meanwhile, none held
    assert int(clean_redis.hget(LANE_DEPTHS_KEY, "standard")) == 40
    assert int(clean_redis.hget(LIST_DEPTHS_KEY, "standard")) == 40


@pytest.mark.cluster
def test_a_paused_leader_is_replaced_and_changes_nothing_once_resumed(clean_redis, beats):
    led_s, oldest_s, old_epoch = _fail_over(clean_redis, beats, signal.SIGSTOP)
    assert led_s < 5 and oldest_s < settings.snapshot_stale_s
    new_epoch = leader.current(clean_redis)[1]
    assert new_epoch > old_epoch
    paused = [p for p in beats.started if p.pid != _leader_pid(clean_redis)]
    jobs = [_stale() for _ in range(10)]
    paused[0].send_signal(signal.SIGCONT)  # wakes mid-round, under its old epoch
    seen = set()
    deadline = time.monotonic() + 4
    while time.monotonic() < deadline:
        seen.add(_snapshot(clean_redis)["epoch"])
        time.sleep(0.05)
    assert seen == {new_epoch}, f"snapshots of epochs {seen}"
    assert leader.current(clean_redis)[1] == new_epoch
    assert sorted(_ids(clean_redis, "standard")) == sorted(jobs)
