"""The overload benchmark's open loop, held at a load of what its pool really serves."""
from __future__ import annotations

import time

import pytest

from benchmarks import overload_trial
from benchmarks.overload_trial import PACE_MIN_SPEED, Pace, Trial, offer


class Pool:
    """A pool that starts ``rate`` jobs a second from the moment it is made."""

    def __init__(self, rate: float) -> None:
        self.rate, self.began, self.sent = rate, time.monotonic(), []

    def send(self, tier: str, account: str, seed: int) -> int:
        self.sent.append(time.monotonic())
        return seed

    def depth(self) -> int:
        return max(0, len(self.sent) - int(self.rate * (time.monotonic() - self.began)))


def test_the_pace_runs_the_plans_clock_at_the_load_over_what_was_served():
    queued = iter([10, 0, 0, 30, 30])
    pace = Pace(2.0, lambda: next(queued), after_s=1.0)
    assert pace.speed(30, 0.5, 20.0) is None  # still in its first second
    assert pace.speed(30, 2.0, 20.0) == 1.0  # 20 served in 2 s, at 2x: 20/s, the plan's
    assert pace.speed(30, 3.0, 40.0) == 0.5  # 30 in 3 s: 20/s, half the plan's 40/s
    # 5 jobs left from an earlier trial and 20 accepted, none queued: 25 served in 2.5 s
    assert pace.speed(20, 2.5, 20.0, queued_before=5) == 1.0
    assert pace.speed(30, 2.0, 20.0) is None  # nothing taken yet: no rate to go by
    assert pace.speed(31, 9.0, 20.0) == PACE_MIN_SPEED  # a stalled pool: the floor
    with pytest.raises(ValueError):
        Pace(0.0, lambda: 0)


def test_a_paced_loop_offers_twice_what_a_slower_pool_serves():
    plan = [(i / 100, "fast", "acme") for i in range(90)]  # 100 jobs/s nominal
    pool = Pool(20.0)
    trial = Trial("gpulanes")
    offer(trial, plan, pool.send, pace=Pace(2.0, pool.depth, after_s=0.4, every_s=0.05))
    assert trial.offered == 90 and len(trial.accepted) == 90
    late = pool.sent[60:]  # well after the pace took over: about 40 jobs/s
    rate = (len(late) - 1) / (late[-1] - late[0])
    assert 32 < rate < 48, rate
    assert 1.0 < trial.submit_s < 3.0  # not the plan's 0.9 s


def test_an_unpaced_loop_keeps_the_plans_times():
    plan = [(i / 100, "fast", "acme") for i in range(30)]
    pool = Pool(20.0)
    trial = Trial("plain")
    offer(trial, plan, pool.send)
    assert 0.25 < trial.submit_s < 1.0


def test_the_plain_side_is_paced_at_the_load_it_is_given(monkeypatch):
    paces = []
    monkeypatch.setattr(overload_trial, "plain_send", lambda size: None)
    monkeypatch.setattr(overload_trial, "offer",
                        lambda trial, plan, send, refusals=(), pace=None: paces.append(pace))
    monkeypatch.setattr(overload_trial, "drain", lambda trial, limit_s, depth: None)
    overload_trial.plain_trial([], None, 1.0, 2.0)
    overload_trial.plain_trial([], None, 1.0)
    assert paces[0].load == 2.0 and paces[1] is None
