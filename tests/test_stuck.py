"""The stuck watchdog's rule, and the bookkeeping it reads: which message each run
holds, and which messages were settled. ``tests/test_refusals.py`` wedges a real
worker."""
from __future__ import annotations

from types import SimpleNamespace

from gpu_worker.hooks import HeldJobs
from gpu_worker.stuck import SETTLE_GRACE_S, Watchdog
from tasks.broker.holder import settled


def _task(tag: str) -> SimpleNamespace:
    return SimpleNamespace(request=SimpleNamespace(properties={"delivery_tag": tag}))


def _received(held: HeldJobs, job_id: str, tag: str) -> None:
    held.on_received(request=SimpleNamespace(id=job_id,
                                             message=SimpleNamespace(delivery_tag=tag)))


def test_a_run_holds_the_message_it_runs_from_not_the_oldest_copy():
    """A later copy of a job can run while an earlier one waits for its countdown: the
    run holds its own message, the waiting copy stays received."""
    held = HeldJobs()
    _received(held, "job", "waiting-copy")
    _received(held, "job", "running-copy")
    held.on_prerun(task_id="job", task=_task("running-copy"))
    assert held.running() == 1
    assert sorted(held.tags()) == ["running-copy", "waiting-copy"]
    held.on_postrun()
    assert held.tags() == ["waiting-copy"] and held.running() == 0


def test_stuck_only_while_redis_takes_writes_then_exits():
    exits: list[int] = []
    dog = Watchdog(exit_after_s=5, exit=exits.append)
    dog.ended("settled-tag", "job-a", 0.0)
    settled("settled-tag", 0.5)
    dog.ended("lost-tag", "job-b", 0.0)
    assert dog.check(SETTLE_GRACE_S - 1) is None  # within the grace
    assert "job-b" in dog.check(SETTLE_GRACE_S + 1) and "1 finished" in dog.stuck
    dog.answered(20.0, took_writes=True)
    dog.answered(40.0, took_writes=False)  # an outage: the clock starts over
    dog.answered(41.0, took_writes=True)
    dog.answered(45.0, took_writes=True)
    assert exits == []
    dog.answered(46.0, took_writes=True)
    assert exits == [75]
    settled("lost-tag", 47.0)
    assert dog.check(48.0) is None and dog.stuck is None
