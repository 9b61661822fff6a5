"""What Flower and the worker's log say of revoked jobs, on a real worker: the events
feed a real ``celery.events.state.State`` (what Flower keeps its tasks in)."""
from __future__ import annotations

import re
import threading
from typing import Iterator

import pytest
from conftest import SMALL, new_gate, wait_at_gate, wait_until

from routing.names import JOB_TASK
from tasks import submit
from tests.flaky_model import open_gate

pytestmark = pytest.mark.cluster

STEPS = 60


@pytest.fixture(scope="module")
def worker(cluster_factory):
    return cluster_factory(workers=1)


@pytest.fixture
def flower_state(app, worker) -> Iterator:
    """The tasks as Flower would see them: a State fed by an event receiver (listening
    once a worker's heartbeat event came through)."""
    state = app.events.State()
    with app.connection_for_read() as conn:
        receiver = app.events.Receiver(conn, handlers={"*": state.event})
        thread = threading.Thread(target=receiver.capture, daemon=True,
                                  kwargs={"limit": None, "timeout": None, "wakeup": True})
        thread.start()
        try:
            wait_until(lambda: state.workers, timeout_s=30, what="a worker's event")
            yield state
        finally:
            receiver.should_stop = True
            thread.join(timeout=10)


def _state_of(state, job_id: str) -> str | None:
    task = state.tasks.get(job_id)
    return None if task is None else task.state


def _logged(worker, pattern: str) -> re.Match | None:
    return re.search(pattern, (worker.log_dir / "workers.log").read_text(errors="replace"))


def test_a_job_revoked_while_running_is_revoked_in_flower(worker, flower_state):
    job = submit("pace:50 a long one", model="flaky", steps=STEPS, width=64, height=64)
    wait_until(lambda: _state_of(flower_state, job.id) == "PROGRESS", timeout_s=30,
               what="Flower's state to show the job's progress")
    job.revoke()
    wait_until(lambda: _state_of(flower_state, job.id) == "REVOKED", timeout_s=30,
               what="Flower's state to show the job revoked")
    assert flower_state.tasks[job.id].name == JOB_TASK and job.state == "REVOKED"
    ran = wait_until(lambda: _logged(worker, rf"job {job.id} revoked after (\d+) of "
                                             rf"{STEPS} steps"), timeout_s=10,
                     what="the worker's log line of the revoked job")
    assert 1 <= int(ran.group(1)) < STEPS


def test_a_job_revoked_while_queued_is_named_in_flower(worker, flower_state):
    """Revoked by broadcast, the worker discards the message as it arrives; revoked in
    Redis alone (a worker that missed the broadcast), its run finds it revoked as it
    begins. Either way Flower shows the job REVOKED under the task's name."""
    from tasks.broker.control import record_revokes

    gate = new_gate()
    blocker = submit(f"gate:{gate} hold the worker", model="flaky", **SMALL)
    wait_at_gate(blocker, gate)
    broadcast, in_redis = (submit(f"queued {i}", **SMALL) for i in range(2))
    broadcast.revoke()
    record_revokes([in_redis.id])
    open_gate(gate)
    blocker.get(timeout=30)
    for job in (broadcast, in_redis):
        wait_until(lambda: _state_of(flower_state, job.id) == "REVOKED", timeout_s=30,
                   what=f"Flower's state to show job {job.id} revoked")
        assert flower_state.tasks[job.id].name == JOB_TASK and job.state == "REVOKED"
    assert wait_until(lambda: _logged(worker, f"job {in_redis.id} revoked before it ran"),
                      timeout_s=10, what="the worker's log line of the revoked job")
