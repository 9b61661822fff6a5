"""Redis frozen (SIGSTOP) in the middle of a worker's take, on real processes.

A take is one Lua step (``tasks.broker.handover``): the message leaves its list and is
recorded as the worker's. If Redis freezes as the worker sends it, the take times out
(the default timeout) and the consumer reconnects, dropping too the jobs it held for
their countdown; Redis runs the take once it wakes, recording a message the worker
never got. The worker alone (no beat here) must run both jobs, each once, within
seconds: its next take is sent with the lost one's token and answered that message,
and the jobs the consumer dropped are given back.
"""
from __future__ import annotations

import os
import signal
import threading
import time
import uuid
from collections import Counter

import pytest
import redis
from conftest import SMALL, poll, wait_until

from routing.lanes import Route
from routing.names import JOB_TASK
from tasks import submit
from tasks.broker import scripts
from tasks.broker.keys import HELD_PREFIX, LANE_DEPTHS_KEY
from tasks.broker.message import JobMessage, JobRoute
from tasks.jobs.schema import validate
from tasks.settings import settings
from tests.harness.faults import worker_pids

pytestmark = pytest.mark.cluster


@pytest.fixture(scope="module")
def worker(cluster_factory):
    return cluster_factory(workers=1, beat=False)


def _held(client) -> int:
    """How many messages all holders hold."""
    return sum(client.hlen(key) for key in client.scan_iter(f"{HELD_PREFIX}*"))


def _waiting(client) -> int:
    """How many messages wait in the lanes' lists."""
    return sum(int(n) for field, n in client.hgetall(LANE_DEPTHS_KEY).items()
               if b"@" not in field)  # (not the lanes' counts per level)


def _with_countdown(app, prompt: str, countdown_s: float):
    """A standard job published with a countdown: its worker holds it until then."""
    job = validate(prompt, tier="standard", **SMALL)
    message = JobMessage(job, JobRoute.of(Route(lane="standard", requested_tier="standard")),
                         time.time())
    return app.send_task(JOB_TASK, task_id=str(uuid.uuid4()), kwargs=message.kwargs(),
                         countdown=countdown_s, queue="standard")


def _waiting_for_a_stopped_worker(worker_pid: int, client):
    """A job submitted while the worker is stopped (SIGSTOP; it is left stopped): its
    wake-up waits unread in the worker's socket, and the job in its lane. A stop that
    caught the worker mid-take lets it take the job once it is woken: that one runs as
    usual, and another is tried."""
    for _ in range(10):
        os.kill(worker_pid, signal.SIGSTOP)
        job = submit("taken as Redis froze", tier="standard", **SMALL)
        if poll(lambda: _waiting(client) == 1, timeout_s=0.5, every_s=0.01):
            return job
        os.kill(worker_pid, signal.SIGCONT)
        job.get(timeout=30)
    raise AssertionError("no job waited for the stopped worker")


class Takes:
    """The token of every take Redis runs, read from its MONITOR stream on a connection
    of its own (no timeout: it waits out the freezes). A token run twice is a take
    whose answer was lost, sent again."""

    def __init__(self, redis_server) -> None:
        self.sha = scripts.script("hand_over").sha
        self.tokens: list[str] = []
        self.monitor = redis.Redis(unix_socket_path=str(redis_server.socket),
                                   socket_timeout=None).monitor()
        self.monitor.__enter__()
        threading.Thread(target=self._read, name="takes", daemon=True).start()

    def _read(self) -> None:
        try:
            for seen in self.monitor.listen():
                parts = seen["command"].split(" ")
                if parts[0].lower() == "evalsha" and parts[1] == self.sha:
                    self.tokens.append(parts[3 + int(parts[2])])
        except (redis.RedisError, OSError, ValueError):  # closed
            return

    def repeated(self, since: int) -> set[str]:
        """The tokens sent more than once from take ``since`` (an index in ``tokens``)."""
        return {t for t, n in Counter(self.tokens[since:]).items() if n > 1}

    def close(self) -> None:
        self.monitor.__exit__(None, None, None)


#: Freezes tried for one that cuts a take off (see :func:`_a_take_cut`).
FREEZES = 3


def _a_take_cut(worker_pid: int, redis_server, client, takes: Takes) -> bool:
    """Freeze Redis while a job waits for the stopped worker, wake the worker (it hears
    the job and sends its take), and thaw Redis after the take's timeout and that of
    the consumer's reconnection: the job runs, once. Whether a take was cut off (Redis
    ran it, and the worker sent it again): woken, the worker may meet the freeze in
    another call first, and then takes the job whole once Redis is back."""
    cut = _waiting_for_a_stopped_worker(worker_pid, client)
    since = len(takes.tokens)
    os.kill(redis_server.process.pid, signal.SIGSTOP)
    os.kill(worker_pid, signal.SIGCONT)  # it reads the wake-up, and its take waits
    try:
        time.sleep(2 * settings.redis_timeout_s + 2)
    finally:
        os.kill(redis_server.process.pid, signal.SIGCONT)
    done = cut.get(timeout=30)
    assert done["job_id"] == cut.id and done["attempts"] == 1
    return bool(takes.repeated(since))


@pytest.mark.parametrize("holding", [False, True], ids=["idle", "holding-a-countdown"])
def test_a_take_cut_by_a_frozen_redis_loses_no_job(worker, app, redis_server, clean_redis,
                                                   holding):
    """``idle``: the worker holds nothing else, so no keep-alive of its own fails in the
    freeze. ``holding-a-countdown``: it holds a job for its countdown, which the consumer
    drops as it reconnects."""
    (worker_pid,) = worker_pids(app, 1).values()
    submit("a first job", tier="standard", **SMALL).get(timeout=60)  # its scripts loaded
    held = _with_countdown(app, "held for its countdown", countdown_s=15) if holding else None
    wait_until(lambda: _held(clean_redis) == int(holding), what="the worker's hold")
    takes = Takes(redis_server)
    try:
        for _ in range(FREEZES):
            if _a_take_cut(worker_pid, redis_server, clean_redis, takes):
                break
        else:
            raise AssertionError(f"no take was cut off in {FREEZES} freezes")
    finally:
        takes.close()
    if held is not None:
        done = held.get(timeout=45)
        assert done["job_id"] == held.id and done["attempts"] == 1
    wait_until(lambda: not _held(clean_redis), what="no record left behind")
    assert _waiting(clean_redis) == 0  # and no copy left in a lane
