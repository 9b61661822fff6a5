"""Control tasks run only where they belong: in the leading beat, under its epoch.

A GPU worker does not register beat's tasks: one sent to a lane is dead-lettered, not
run. Beat's own code run without a leader's epoch writes nothing, and the epoch a new
leader takes never goes back, even when its key was lost.
"""
from __future__ import annotations

import json
import logging
import time

import pytest
from conftest import SMALL, wait_until

from beat.heartbeat import expire_dead_letters, heartbeat, write_round
from beat.lease import Leadership
from beat.movers import move_queued
from routing.names import FAST, HEARTBEAT_TASK, MOVERS_TASK
from tasks.broker import handover, leader
from tasks.broker.keys import (
    BEAT_EPOCH_KEY,
    BEAT_LEADER_KEY,
    DEAD_INDEX_KEY,
    DEAD_KEY,
    SNAPSHOT_KEY,
    WORKERS_KEY,
)
from tasks.broker.leader import fenced
from tasks.jobs.deadletter import dead_jobs
from tasks.jobs.schema import validate
from tasks.worker.generate import generate


def _stale_fast_job() -> str:
    """A downgradable job waiting in the fast lane far past its budget there."""
    job = validate("p", tier=FAST, account="a", model="demo", seed=1, downgradable=True,
                   **SMALL)
    return generate.apply_async(kwargs={"job": job.encode(), "route": {
        "lane": FAST, "requested_tier": FAST}, "submitted_at": time.time() - 10_000},
        queue=FAST).id


def test_beats_rounds_outside_a_leaders_epoch_write_nothing(clean_redis, caplog):
    assert Leadership(clean_redis).renew() == 1  # a beat leads: only its epoch may write
    held = _stale_fast_job()
    gone = "gpu9@h/1/1.0"  # a worker, never heard from, that took it and died
    handover.take(clean_redis, gone, [FAST], "t1")
    assert gone in handover.holders(clean_redis)  # where beat's heartbeat would find it
    stale = _stale_fast_job()
    clean_redis.hset(DEAD_KEY, "old-letter", json.dumps({"failed_at": 1.0}))
    clean_redis.zadd(DEAD_INDEX_KEY, {"old-letter": 1.0})
    with caplog.at_level(logging.ERROR, logger="tasks.broker.leader"):
        assert heartbeat() == move_queued() == leader.NOT_LEADING  # as on a worker: no epoch
        assert not write_round(clean_redis, {"at": 1.0}, {"gpu0@h": {"alive": True}})
        assert expire_dead_letters(clean_redis, time.time()) == 0
    assert clean_redis.get(SNAPSHOT_KEY) is None and not clean_redis.exists(WORKERS_KEY)
    assert [json.loads(raw)["headers"]["id"] for raw in clean_redis.lrange(FAST, 0, -1)] \
        == [stale]  # neither moved down nor joined by the dead worker's
    assert [held in raw for _, raw in handover.held(clean_redis, gone).values()] == [True]
    assert clean_redis.hexists(DEAD_KEY, "old-letter")
    refused = [r.getMessage() for r in caplog.records]
    assert any("heartbeat round refused" in m for m in refused), refused
    assert any("movers round refused" in m for m in refused), refused


def test_a_new_lead_never_takes_an_epoch_again_after_the_key_is_lost(clean_redis):
    first, second = Leadership(clean_redis, lease_s=0.3), Leadership(clean_redis, lease_s=0.3)
    assert first.renew() == 1 and second.renew() == 0
    assert wait_until(second.renew, 5, what="the lease to lapse") == 2
    assert first.renew() == 0  # it stands by, and has seen epoch 2
    clean_redis.delete(BEAT_EPOCH_KEY, BEAT_LEADER_KEY)  # a flush, a restore, an eviction
    assert first.renew() == 3
    with fenced(2):  # the old leader, paused through all this, wakes up
        assert not write_round(clean_redis, {"at": 1.0}, {})
    assert clean_redis.get(SNAPSHOT_KEY) is None
    clean_redis.delete(BEAT_EPOCH_KEY)  # lost under a leader that keeps its lease
    assert first.renew() == 4 and leader.current(clean_redis) == (first.identity, 4)


# --- on a real worker ---------------------------------------------------------------

def _letters(client, job_ids) -> dict[str, dict] | None:
    """The dead letters of ``job_ids``, once every one of them is there."""
    found = {e["job_id"]: e for e in dead_jobs(client) if e["job_id"] in job_ids}
    return found if len(found) == len(job_ids) else None


@pytest.fixture(scope="module")
def cluster(cluster_factory):
    return cluster_factory(workers=1, beat=False)


@pytest.mark.cluster
def test_a_control_task_sent_to_a_worker_is_dead_lettered_not_run(cluster, app, clean_redis):
    sent = {app.send_task(name, queue=FAST).id: name for name in (HEARTBEAT_TASK, MOVERS_TASK)}
    letters = wait_until(lambda: _letters(clean_redis, sent), 30,
                         what="both control tasks to be dead-lettered (`lanes dead list`)")
    for job_id, name in sent.items():
        assert letters[job_id]["reason"] == "invalid_message"
        assert "no task" in letters[job_id]["error"] and name in letters[job_id]["error"]
    assert clean_redis.get(SNAPSHOT_KEY) is None and not clean_redis.exists(WORKERS_KEY)
    assert clean_redis.llen(FAST) == 0
    log = (cluster.log_dir / "workers.log").read_text()
    assert not [line for line in log.splitlines()
                if "gpulanes.heartbeat" in line and "succeeded" in line]
