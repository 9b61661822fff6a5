"""Redis frozen (SIGSTOP) in the middle of a worker's take, on real processes.

kombu pops a message with ``BRPOP``, then records it as taken (the take script); if
Redis freezes between the two, the take times out (the default timeout), kombu drops
the message and the consumer reconnects, dropping too the jobs it held for their
countdown. Redis runs the take once it wakes: the records name a worker that holds
nothing. The worker alone (no beat here) must put both jobs back within seconds, not
after the visibility timeout (630 s).
"""
from __future__ import annotations

import os
import signal
import time
import uuid

import pytest
from conftest import SMALL, poll, wait_until

from routing.lanes import Route
from routing.names import JOB_TASK
from tasks import submit
from tasks.broker.keys import HOLDERS_KEY
from tasks.broker.message import JobMessage, JobRoute
from tasks.jobs.schema import validate
from tasks.settings import settings
from tests.harness.faults import worker_pids

pytestmark = pytest.mark.cluster


@pytest.fixture(scope="module")
def worker(cluster_factory):
    # the default timeout: nothing here may wait it out
    assert "GPULANES_VISIBILITY_TIMEOUT_S" not in os.environ and settings.visibility_timeout_s > 600
    return cluster_factory(workers=1, beat=False)


def _with_countdown(app, prompt: str, countdown_s: float):
    """A standard job published with a countdown: its worker holds it until then."""
    job = validate(prompt, tier="standard", **SMALL)
    message = JobMessage(job, JobRoute.of(Route(lane="standard", requested_tier="standard")),
                         time.time())
    return app.send_task(JOB_TASK, task_id=str(uuid.uuid4()), kwargs=message.kwargs(),
                         countdown=countdown_s, queue="standard")


def _popped_by_a_stopped_worker(worker_pid: int, client):
    """A job Redis handed to the worker's waiting BRPOP while the worker was stopped
    (SIGSTOP; it is left stopped, the reply unread). The worker's BRPOP times out and is
    sent again every second: a job submitted in between waits for it; that one runs as
    usual, and another is tried."""
    for _ in range(10):
        wait_until(lambda: any(c["cmd"] == "brpop" and "b" in c["flags"]
                               for c in client.client_list()), what="the worker's BRPOP")
        os.kill(worker_pid, signal.SIGSTOP)
        job = submit("taken as Redis froze", tier="standard", **SMALL)
        if poll(lambda: not client.llen("standard"), timeout_s=0.5, every_s=0.01):
            return job
        os.kill(worker_pid, signal.SIGCONT)
        job.get(timeout=30)
    raise AssertionError("the worker never took a job while stopped")


#: Freezes tried for one that cuts a take off (see :func:`_a_take_cut`).
FREEZES = 3


def _a_take_cut(worker, worker_pid: int, redis_server, client) -> bool:
    """Freeze Redis as the stopped worker's BRPOP holds a job, wake the worker, and
    thaw Redis after the take's timeout and that of kombu's restore as the consumer
    reconnects: the job runs, once. Whether the take was cut off: woken, the consumer
    may meet the freeze in another call first, and then takes the job whole once Redis
    is back (a fresh-clone CI run saw it: no connection lost, the job run once)."""
    log = worker.log_dir / "workers.log"
    lost_before = log.read_text(errors="replace").count("Connection to broker lost")
    cut = _popped_by_a_stopped_worker(worker_pid, client)
    os.kill(redis_server.process.pid, signal.SIGSTOP)
    os.kill(worker_pid, signal.SIGCONT)  # it reads its job, and its take waits
    try:
        time.sleep(2 * settings.redis_timeout_s + 2)
    finally:
        os.kill(redis_server.process.pid, signal.SIGCONT)
    done = cut.get(timeout=30)
    assert done["job_id"] == cut.id and done["attempts"] == 1
    return log.read_text(errors="replace").count("Connection to broker lost") > lost_before


@pytest.mark.parametrize("holding", [False, True], ids=["idle", "holding-a-countdown"])
def test_a_take_cut_by_a_frozen_redis_loses_no_job(worker, app, redis_server, clean_redis,
                                                   holding):
    """``idle``: the worker holds nothing else, so no keep-alive of its own fails in the
    freeze. ``holding-a-countdown``: it holds a job for its countdown, which the consumer
    drops as it reconnects."""
    (worker_pid,) = worker_pids(app, 1).values()
    submit("a first job", tier="standard", **SMALL).get(timeout=60)  # its scripts loaded
    held = _with_countdown(app, "held for its countdown", countdown_s=15) if holding else None
    wait_until(lambda: clean_redis.hlen(HOLDERS_KEY) == int(holding), what="the worker's hold")
    for _ in range(FREEZES):
        if _a_take_cut(worker, worker_pid, redis_server, clean_redis):
            break
    else:
        raise AssertionError(f"no take was cut off in {FREEZES} freezes")
    if held is not None:
        assert held.get(timeout=45)["job_id"] == held.id
    wait_until(lambda: not clean_redis.hlen(HOLDERS_KEY), what="no record left behind")
