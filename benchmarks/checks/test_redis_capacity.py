"""The Redis capacity benchmark's arithmetic: the idle window taken off, the medians."""
from __future__ import annotations

from collections import Counter

import pytest

from benchmarks.redis_capacity import TOP, Spent, medians


def test_an_idle_window_comes_off_each_command_and_the_cpu():
    busy = Spent(2.0, 0.010, Counter(evalsha=3000, info=40)) + Spent(1.0, 0.002, Counter(zadd=50))
    net = busy - Spent(3.0, 0.003, Counter(info=40, ping=10))
    assert net.seconds == pytest.approx(0.0) and net.cpu_s == pytest.approx(0.009)
    assert net.command_s == pytest.approx((3000 + 50 - 10) / 1e6)  # noise below zero counts


def test_medians_keep_the_costliest_commands_of_any_round():
    runs = [{"cpu_us": us, "commands_us": {"evalsha": us / 2,
                                            **{f"cmd{k}": float(k) for k in range(1, 9)}}}
            for us in (300.0, 100.0, 200.0)]
    runs[0]["commands_us"].update({f"rare{k}": 1000.0 for k in range(TOP)})
    found = medians(runs)
    assert found["cpu_us"] == 200.0
    assert found["commands_us"] == {"evalsha": 100.0, "cmd8": 8.0, "cmd7": 7.0, "cmd6": 6.0,
                                    "cmd5": 5.0, "cmd4": 4.0}  # rare*: one round, median 0
    assert list(found["commands_us"]) == ["evalsha", "cmd8", "cmd7", "cmd6", "cmd5", "cmd4"]
