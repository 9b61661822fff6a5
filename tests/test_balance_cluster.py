"""On a real cluster (two worker processes, beat): jobs queued for one busy worker are
shared with the idle one, each job served once."""
from __future__ import annotations

import time

import pytest
from conftest import bind_own_queues, wait_until

from routing.names import worker_queue


@pytest.fixture(scope="module")
def cluster(cluster_factory):
    return cluster_factory(workers=2, beat=True)


def _queue_for(app, host: str, jobs: int) -> list:
    from tasks.jobs.schema import validate
    from tasks.worker.generate import generate

    own = worker_queue("standard", host)
    bind_own_queues(app, own)
    sent = []
    for i in range(jobs):  # as a router that saw only `host` would have placed them
        job = validate(f"job {i}", tier="standard", account="acct", model="demo", seed=i,
                       steps=30, width=256, height=256)
        sent.append(generate.apply_async(kwargs={
            "job": job.encode(), "route": {"lane": "standard", "requested_tier": "standard"},
            "submitted_at": time.time()}, exchange=own, routing_key=own))
    return sent


@pytest.mark.cluster
@pytest.mark.timeout(300)
def test_an_idle_worker_takes_jobs_queued_for_a_busy_one(cluster, app, clean_redis):
    from tasks.broker.keys import WORKERS_KEY

    busy, idle = cluster.hostnames
    wait_until(lambda: len(clean_redis.hgetall(WORKERS_KEY)) == 2, timeout_s=60,
               what="beat to hear both workers")
    sent = _queue_for(app, busy, 40)
    outs = [result.get(timeout=240) for result in sent]
    assert len({out["job_id"] for out in outs}) == len(sent)  # every job, once
    ran = [out["worker"] for out in outs]
    assert ran.count(idle) > 0, "the idle worker took none of the busy one's queue"
    assert ran.count(busy) > 0
    assert all(out["lane"] == "standard" and "downgraded_from" not in out for out in outs)
