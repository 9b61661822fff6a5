"""Health checks that heal: a SIGKILLed worker's job runs again elsewhere, quickly."""
from __future__ import annotations

import os
import signal
import time

import pytest
from conftest import SMALL, new_gate, wait_at_gate, wait_until

from tasks import submit
from tasks.broker.keys import attempts_key
from tasks.settings import settings
from tests.flaky_model import open_gate

pytestmark = pytest.mark.cluster


@pytest.fixture(scope="module")
def cluster(cluster_factory):
    return cluster_factory(workers=2, beat=True)


def _pids(app, expected: int) -> dict[str, int] | None:
    answers = app.control.broadcast("lanes_stats", reply=True, timeout=0.5) or []
    pids = {host: reply["pid"] for answer in answers for host, reply in answer.items()}
    return pids if len(pids) == expected else None


def test_killed_workers_jobs_complete_elsewhere_within_seconds(cluster, app, clean_redis):
    gate = new_gate()
    doomed = submit(f"gate:{gate} killed mid-job", model="flaky", tier="fast", **SMALL)
    wait_at_gate(doomed, gate)
    victim = doomed.info  # STARTED meta: the worker's hostname and pid
    stream = [submit(f"stream {i}", tier=("fast", "standard", "relaxed")[i % 3], seed=i, **SMALL)
              for i in range(30)]
    killed_at = time.monotonic()
    os.kill(victim["pid"], signal.SIGKILL)
    open_gate(gate)
    out = doomed.get(timeout=60)
    recovered_s = time.monotonic() - killed_at
    results = [r.get(timeout=60) for r in stream]
    assert out["attempts"] == 2
    # beat gave it back from the dead worker's record (a heartbeat a second here)
    assert recovered_s < 20
    assert len({r["job_id"] for r in results}) == len(stream)  # none lost
    # none doubled: each job's run counter (kept in Redis by every copy) says one run
    runs = [int(clean_redis.get(attempts_key(r["job_id"]))) for r in results]
    assert runs == [1] * len(stream)
    assert int(clean_redis.get(attempts_key(doomed.id))) == 2
    # the supervisor restarted the killed worker and it rejoined under its name
    pids = wait_until(lambda: _pids(app, 2), timeout_s=60, what="both workers answering")
    print(f"killed worker's job done {recovered_s:.1f}s after the kill")
    assert victim["hostname"] in pids and pids[victim["hostname"]] != victim["pid"]


def test_a_duplicate_delivery_returns_the_first_result(cluster, app):
    from tasks.worker.generate import generate

    first = submit("once", seed=11, **SMALL)
    out = first.get(timeout=60)
    again = generate.apply_async(kwargs={"job": {}, "route": {}, "submitted_at": 0.0},
                                 task_id=first.id, queue="standard")
    assert again.get(timeout=60) == out  # answered from the stored result, not re-run
