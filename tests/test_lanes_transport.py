"""gpulanes' kombu transport under a plain Celery app, in real worker processes: tasks and
results, queue and priority order, remote control and events, the hand-over's records,
a holder killed or frozen mid-task, and no polling while idle."""
from __future__ import annotations

import ctypes
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from conftest import STATE_DIR, TEST_ENV, wait_until

LOG = STATE_DIR / "lanes_app.log"
os.environ["LANES_APP_BROKER"] = TEST_ENV["GPULANES_BROKER_URL"]
os.environ["LANES_APP_LOG"] = str(LOG)

from tests.lanes_app import add, app, nap  # noqa: E402  after its environment

from tasks.broker import handover  # noqa: E402
from tasks.broker.keys import HELD_PREFIX, LIST_DEPTHS_KEY  # noqa: E402


def _die_with_the_tests() -> None:
    """A worker whose test process died (a session killed) stops too (PR_SET_PDEATHSIG)."""
    ctypes.CDLL("libc.so.6").prctl(1, signal.SIGKILL)


def start_worker(name: str, queues: str = "hi,lo") -> subprocess.Popen:
    out = open(STATE_DIR / f"lanes-{name}.out", "a")
    worker = subprocess.Popen(
        [sys.executable, "-m", "celery", "-A", "tests.lanes_app", "worker", "-P", "threads",
         "-c", "1", "-Q", queues, "-n", f"{name}@lanes", "--without-mingle",
         "--without-gossip", "-l", "info"], env=dict(os.environ), stdout=out,
        stderr=subprocess.STDOUT, preexec_fn=_die_with_the_tests)
    wait_until(lambda: app.control.ping(destination=[f"{name}@lanes"], timeout=0.5), 60,
               what=f"worker {name} to answer")
    return worker


def stop(worker: subprocess.Popen) -> None:
    if worker.poll() is None:
        os.kill(worker.pid, signal.SIGCONT)
        worker.terminate()
        try:
            worker.wait(20)
        except subprocess.TimeoutExpired:
            worker.kill()
            worker.wait()


@pytest.fixture(scope="module")
def worker(redis_server):
    process = start_worker("one")
    yield process
    stop(process)


def ran() -> list[str]:
    return LOG.read_text().split() if LOG.exists() else []


@pytest.fixture(autouse=True)
def fresh_log():
    LOG.unlink(missing_ok=True)


def records(client) -> dict[str, dict]:
    return {key.decode(): client.hgetall(key) for key in client.keys(HELD_PREFIX + "*")}


def test_tasks_run_in_queue_then_priority_order(worker, clean_redis):
    assert add.delay(2, 3).get(timeout=20) == 5
    blocker = nap.apply_async((1.0, "block"), queue="lo")
    wait_until(lambda: any(records(clean_redis).values()), 10, what="the blocker taken")
    late = [nap.apply_async((0, f"lo{i}"), queue="lo", priority=i % 2 * 6) for i in range(4)]
    first = nap.apply_async((0, "hi"), queue="hi")
    for result in [blocker, *late, first]:
        result.get(timeout=30)
    # the hi queue first; in lo, priority 0 before 6, each level first in, first out
    assert ran() == ["block", "hi", "lo0", "lo2", "lo1", "lo3"]
    assert not clean_redis.hgetall(LIST_DEPTHS_KEY)
    # a task's ack follows its result (late acks): its record goes a moment after
    wait_until(lambda: not any(records(clean_redis).values()), 10, what="the records dropped")


def test_the_holder_is_recorded_in_the_take_and_dropped_with_the_ack(worker, clean_redis):
    result = nap.apply_async((1.5, "held"), queue="lo")
    held = wait_until(lambda: [r for r in records(clean_redis).values() if r], 10,
                      what="the record of the take")
    assert clean_redis.llen("lo") == 0
    [record] = held[0].values()
    assert record.startswith(b"lo\n") and result.id.encode() in record
    assert result.get(timeout=20) == "held"
    wait_until(lambda: not any(records(clean_redis).values()), 10, what="the record dropped")


def test_remote_control_and_events(worker, clean_redis):
    assert app.control.ping(timeout=2) == [{"one@lanes": {"ok": "pong"}}]
    blocker = nap.apply_async((1.0, "block"), queue="lo")
    doomed = nap.apply_async((0, "doomed"), queue="lo")
    doomed.revoke()
    seen: list[str] = []
    with app.connection() as connection:
        receiver = app.events.Receiver(connection, handlers={
            "task-succeeded": lambda event: seen.append(event["uuid"])})
        kept = nap.apply_async((0, "kept"), queue="lo")
        deadline = time.monotonic() + 20
        for _ in receiver.itercapture(limit=None, timeout=20, wakeup=False):
            if kept.id in seen or time.monotonic() > deadline:
                break
    assert blocker.get(timeout=20) == "block" and kept.get(timeout=20) == "kept"
    assert kept.id in seen
    assert "doomed" not in ran()


def test_a_killed_holders_message_is_put_back_and_runs_elsewhere(redis_server, clean_redis):
    first = start_worker("victim", queues="solo")
    try:
        result = nap.apply_async((3.0, "survivor"), queue="solo")
        wait_until(lambda: any(records(clean_redis).values()), 20, what="the take")
        [holder_key] = [k for k, v in records(clean_redis).items() if v]
        holder = holder_key[len(HELD_PREFIX):]
        first.kill()
        first.wait()
        assert clean_redis.llen("solo") == 0  # the message is nowhere but in the record
        assert handover.put_back_all(clean_redis, holder) == 1
        assert clean_redis.llen("solo") == 1 and not clean_redis.exists(holder_key)
        second = start_worker("heir", queues="solo")
        try:
            assert result.get(timeout=30) == "survivor"
        finally:
            stop(second)
    finally:
        stop(first)


def test_a_frozen_holders_message_is_put_back_once_and_runs_elsewhere(redis_server,
                                                                      clean_redis):
    frozen = start_worker("frozen", queues="solo")
    try:
        result = nap.apply_async((2.0, "thawed"), queue="solo")
        wait_until(lambda: any(records(clean_redis).values()), 20, what="the take")
        [holder_key] = [k for k, v in records(clean_redis).items() if v]
        os.kill(frozen.pid, signal.SIGSTOP)
        assert handover.put_back_all(clean_redis, holder_key[len(HELD_PREFIX):]) == 1
        assert handover.put_back_all(clean_redis, holder_key[len(HELD_PREFIX):]) == 0
        other = start_worker("other", queues="solo")
        try:
            assert result.get(timeout=30) == "thawed"
            os.kill(frozen.pid, signal.SIGCONT)  # its own run ends too: at least once
            wait_until(lambda: ran().count("thawed") == 2, 30, what="the frozen run's end")
            assert not any(records(clean_redis).values())
        finally:
            stop(other)
    finally:
        stop(frozen)


def test_a_take_repeated_after_a_lost_answer_gets_the_same_message(clean_redis):
    for n in range(2):
        handover.push(clean_redis, "q", f'{{"n": {n}}}')
    first = handover.take(clean_redis, "h", ["q"], "t1")
    again = handover.take(clean_redis, "h", ["q"], "t1")
    assert first == again and first.raw == '{"n": 0}'
    assert handover.take(clean_redis, "h", ["q"], "t2").raw == '{"n": 1}'
    assert set(handover.held(clean_redis, "h")) == {"t1", "t2"}
    assert handover.take(clean_redis, "h", ["q"], "t3") is None
    handover.ack(clean_redis, "h", "t1", "t2")
    assert handover.held(clean_redis, "h") == {}


def test_an_idle_worker_does_not_poll(worker):
    def cpu_s() -> float:
        fields = Path(f"/proc/{worker.pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")

    before, started = cpu_s(), time.monotonic()
    time.sleep(5)
    share = (cpu_s() - before) / (time.monotonic() - started)
    assert share < 0.05, f"an idle worker used {share:.1%} of a core"


def test_an_unreadable_item_is_set_aside_and_the_queue_goes_on(worker, clean_redis):
    from tasks.broker.keys import UNREADABLE_KEY

    handover.push(clean_redis, "lo", "not a message")
    handover.push(clean_redis, "lo", '{"no": "properties"}')
    assert add.apply_async((1, 1), queue="lo").get(timeout=20) == 2
    aside = [item.decode() for item in clean_redis.lrange(UNREADABLE_KEY, 0, -1)]
    assert [item.split("\n")[0] for item in aside] == ["lo", "lo"]
    assert {item.split("\n", 2)[2] for item in aside} == {"not a message", '{"no": "properties"}'}
    # the task's ack follows its result (late acks): its record goes a moment after
    wait_until(lambda: not any(records(clean_redis).values()), 10, what="the records dropped")
