"""Frozen workers and revokes on real processes, with the default timeouts.

A worker paused by the kernel (SIGSTOP) is the fault a fleet sees every day: a
VM migrated, a GC stall. Each test counts what ran: runs begun and runs that
reached their end are counted by the test model itself, across processes.
"""
from __future__ import annotations

import json
import os
import signal

import pytest
from conftest import SMALL, new_gate, wait_at_gate, wait_until

import tasks.broker.enqueue as enqueue
from routing.names import JOB_TASK, LANES
from tasks import submit
from tasks.broker.keys import HELD_PREFIX, METRICS_KEY, parse_entry
from tasks.jobs.accounts import fast_seconds_left
from tasks.settings import settings
from tasks.worker.generate import STALE_FIELD
from tests.flaky_model import open_gate, runs_finished, runs_started
from tests.harness.faults import JobStream, settle, wait_replaced, worker_pids

pytestmark = pytest.mark.cluster


@pytest.fixture(scope="module")
def cluster(cluster_factory):
    return cluster_factory(workers=2, beat=True)


def _held_by(client, job_id: str) -> tuple[str, str] | None:
    """(the worker process "host/pid/start" recorded as holding a message of ``job_id``,
    the take token of its record)."""
    for key in client.keys(HELD_PREFIX + "*"):
        for token, record in client.hgetall(key).items():
            if json.loads(parse_entry(record)[1])["headers"]["id"] == job_id:
                return key.decode()[len(HELD_PREFIX):], token.decode()
    return None


def _holder_of(client, job_id: str) -> str | None:
    held = _held_by(client, job_id)
    return held[0] if held else None


def _pid(incarnation: str) -> int:
    return int(incarnation.rsplit("/", 2)[1])


def _logged(cluster, text: str) -> bool:
    return text in (cluster.log_dir / "workers.log").read_text(errors="replace")


def _stale_runs(client) -> int:
    return int(client.hget(METRICS_KEY, STALE_FIELD) or 0)


def test_a_worker_frozen_mid_job_stops_at_its_next_step(cluster, app, clean_redis):
    """Finding 2: the frozen copy used to wake up and run to the end beside the new one."""
    gate, seed = new_gate(), 21
    prompt = f"gate:{gate} frozen mid-job"
    stream = JobStream().start(rate_per_s=8)
    job = submit(prompt, model="flaky", seed=seed, **SMALL)
    wait_at_gate(job, gate)
    frozen = job.info  # STARTED meta of the first run: its worker and pid
    os.kill(frozen["pid"], signal.SIGSTOP)
    try:
        wait_until(lambda: runs_started(prompt, seed) == 2, timeout_s=30,
                   what="a second run on the other worker")
    finally:
        os.kill(frozen["pid"], signal.SIGCONT)
    open_gate(gate)  # both copies are at the gate now: the woken one is stale
    out = job.get(timeout=60)
    wait_until(lambda: _stale_runs(clean_redis) == 1, timeout_s=30,
               what="the woken copy to find itself stale and stop")
    stream.stop()
    stream.accepted[job.id] = job
    counts = settle(stream, "worker SIGSTOP mid-job", clean_redis, timeout_s=60)
    assert out["attempts"] == 2 and out["worker"] != frozen["hostname"]
    assert runs_finished(prompt, seed) == 1  # the stale copy stopped after one step
    assert counts.lost == 0 and counts.duplicated == 0 and counts.failed == 0
    assert counts.completed == counts.accepted > 10


def test_a_woken_retry_holder_never_erases_the_copy_that_replaced_it(cluster, app,
                                                                     clean_redis):
    """A worker frozen while it held a job's retry wakes after its copy was put back and
    taken by another worker: its ack drops only its own record (each take has a token
    of its own), so the job survives the new holder's death."""
    gate, seed = new_gate(), 22
    prompt = f"transient:1@6 gate:{gate} retried, frozen, then its new holder killed"
    job = submit(prompt, model="flaky", seed=seed, **SMALL)
    try:
        # the retry held, and the first run's end recorded (RETRY): frozen earlier, the
        # woken worker would record it over the second run's STARTED
        holder = wait_until(lambda: runs_started(prompt, seed) == 1 and job.state == "RETRY"
                            and _holder_of(clean_redis, job.id),
                            timeout_s=30, what="a worker to hold the retry, waiting 6 s")
        os.kill(_pid(holder), signal.SIGSTOP)
        try:
            wait_until(lambda: runs_started(prompt, seed) == 2 and isinstance(job.info, dict)
                       and job.info.get("pid") not in (None, _pid(holder)),
                       timeout_s=40, what="the retry put back and begun on the other worker")
        finally:
            os.kill(_pid(holder), signal.SIGCONT)
        second = job.info
        assert second["pid"] != _pid(holder)
        wait_until(lambda: _logged(cluster, f"{JOB_TASK}[{job.id}] ignored"),
                   timeout_s=30, what="the woken holder's copy to step aside")
        os.kill(second["pid"], signal.SIGKILL)  # the new holder dies mid-run
    finally:
        open_gate(gate)  # a failure above leaves no job at the gate for the next tests
    out = job.get(timeout=60)  # beat put its copy back: a third run
    assert out["attempts"] == 3 and runs_finished(prompt, seed) == 1
    assert wait_replaced(app, second["hostname"], second["pid"])


def test_revoked_jobs_never_run_though_a_worker_restarts(cluster, app, clean_redis,
                                                         monkeypatch):
    """Finding 5: a worker restarted after a revoke never heard of it and ran the jobs."""
    monkeypatch.setattr(enqueue, "ROUTE_HASHING", False)  # shared lanes: each takes one
    gates = [new_gate(), new_gate()]
    blockers = [submit(f"gate:{g} hold a worker", model="flaky", **SMALL) for g in gates]
    for result, gate in zip(blockers, gates):
        wait_at_gate(result, gate)
    before = fast_seconds_left("revoker")
    queued = [submit(f"revoked {i}", model="flaky", seed=100 + i, account="revoker",
                     tier=LANES[i % 3], **SMALL) for i in range(45)]
    for result in queued:
        result.revoke()
    victim = blockers[0].info
    os.kill(victim["pid"], signal.SIGKILL)  # its replacement never hears the broadcast
    assert wait_replaced(app, victim["hostname"], victim["pid"])
    open_gate(gates[0])  # the replacement reruns the killed blocker, then drains the lanes
    blockers[0].get(timeout=60)
    wait_until(lambda: all(r.state == "REVOKED" for r in queued), timeout_s=60,
               what="every revoked job dropped")
    open_gate(gates[1])
    blockers[1].get(timeout=60)
    assert sum(runs_started(f"revoked {i}", 100 + i) for i in range(45)) == 0
    assert fast_seconds_left("revoker") == before  # nothing charged
    assert worker_pids(app, 2)[victim["hostname"]] != victim["pid"]


def test_a_copy_is_kept_when_the_running_holder_lost_its_record(cluster, app, clean_redis):
    """A running job's message put back under it (a channel closes with its messages
    unacked when the worker's connection is reset): the copy finds the job held. It is kept
    for later, not dropped, so the job survives its holder's death."""
    from tasks.broker.handover import put_back

    gate, seed = new_gate(), 23
    prompt = f"gate:{gate} its message put back while it runs"
    job = submit(prompt, model="flaky", seed=seed, **SMALL)
    wait_at_gate(job, gate)
    holder, token = _held_by(clean_redis, job.id)
    assert put_back(clean_redis, holder, token) == 1
    wait_until(lambda: _logged(cluster, "this copy comes back"), timeout_s=30,
               what="the copy to find the job held and be kept for later")
    os.kill(_pid(holder), signal.SIGKILL)  # the holder dies: no record of its own left
    open_gate(gate)
    out = job.get(timeout=60)
    assert out["attempts"] == 2 and runs_finished(prompt, seed) == 1
