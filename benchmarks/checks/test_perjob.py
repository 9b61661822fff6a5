"""The per-job benchmark's arithmetic: the idle background taken off, the goals judged."""
from __future__ import annotations

from collections import Counter

import pytest

from benchmarks.perjob import Window, net_per_job, verdicts


def test_the_idle_background_and_own_polls_come_off_every_job():
    busy = [Window(1.0, Counter(evalsha=12, info=3, exists=4), 0.004),
            Window(1.0, Counter(evalsha=8, info=3, ping=1), 0.003)]
    idle = [Window(1.0, Counter(info=3, ping=2), 0.001), Window(1.0, Counter(info=3), 0.001)]
    net = net_per_job(busy, idle, 10, own=Counter(exists=4))
    assert net["per_job"] == {"evalsha": 2.0}  # only commands above zero are listed
    assert net["commands_per_job"] == pytest.approx(1.9)  # the ping's noise below zero counts
    assert net["redis_cpu_us_per_job"] == pytest.approx(500)
    assert net["seconds"] == 2.0


def _side(commands: float, cpu_us: float, p50: float, p99: float, idle_pct: float) -> dict:
    end = {"commands_per_job": commands, "sent_per_job": commands / 2,
           "redis_cpu_us_per_job": cpu_us, "jobs_s": 100.0}
    return {"end_to_end": end, "worker_only": {"commands_per_job": commands},
            "pickup_ms": {"p50": p50, "p99": p99}, "idle_cpu_pct": idle_pct}


def test_each_goal_is_judged_on_its_own_ratio():
    judged = verdicts({"gpulanes": _side(30, 600, 3.0, 6.0, 0.2),
                       "plain": _side(20, 500, 3.0, 5.0, 0.3)})
    assert judged["ratios"]["commands"] == 1.5 and judged["ratios"]["pickup_p99"] == 1.2
    assert judged["met"] == {"commands": True, "redis_cpu": True, "jobs_s": True,
                             "pickup": False, "idle_cpu_pct": True}
