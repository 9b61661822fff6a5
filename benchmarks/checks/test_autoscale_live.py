"""The live autoscaling check's loop rule and figures (``benchmarks/autoscale_figures.py``),
on a made-up run: the cluster itself runs in ``python benchmarks/autoscale.py``."""
from __future__ import annotations

import argparse

from benchmarks.autoscale_figures import Sample, figures, follow, worker_seconds
from tests.harness.faults import Counts

ARGS = argparse.Namespace(least=1, most=4, poll_s=5.0, low=0.2, high=1.5, low_s=60.0,
                          high_s=100.0, steps=20, step_ms=100)
PHASES = {"low": 1000.0, "high": 1060.0, "down": 1160.0, "end": 1560.0}


def test_the_loop_follows_wanted_within_the_limits():
    assert [follow(w, 1, 4) for w in (0, 1, 3, 4, 9)] == [1, 1, 3, 4, 4]


def test_worker_seconds_hold_each_poll_until_the_next():
    samples = [Sample(0.0, 1, 1, 1, 0.5), Sample(10.0, 3, 1, 3, 2.0)]
    assert worker_seconds(samples, until=15.0) == 1 * 10 + 3 * 5


def _run(ends_at_least: bool = True, lost: int = 0) -> dict:
    samples = [Sample(1000.0 + 5 * i, 1, 1, 1, 0.4) for i in range(12)]  # before the step
    samples += [Sample(1060.0, 1, 1, 1, 0.6), Sample(1075.0, 5, 1, 4, 4.6),
                Sample(1080.0, 5, 2, 4, 4.8), Sample(1100.0, 5, 4, 4, 4.1),
                Sample(1160.0, 5, 4, 4, 3.0), Sample(1460.0, 2, 4, 2, 0.5),
                Sample(1500.0, 1, 2, 1 if ends_at_least else 2, 0.4)]
    outs = [{"started_at": 1070.0 + i, "queued_ms": 2000.0 * i, "preempted": i == 3}
            for i in range(5)]
    counts = Counts("autoscale", 5, 5, 0, 5 - lost, 0, 1, 0, lost, 600.0)
    events = [{"at": 1075.0, "start": "w2"}, {"at": 1460.0, "stop": "w4"},
              {"at": 1461.0, "exited": "w4", "code": 0, "after_s": 1.0}]
    return figures(ARGS, samples, PHASES, outs, counts, events, {"w4": 0})


def test_figures_time_the_step_up_and_count_the_scale_downs():
    found = _run()
    assert found["step_up"] == {"wanted_before": 1, "peak_wanted": 5, "enough": 4,
                                "asked_s": 15.0, "enough_s": 40.0}
    assert found["step_down"] == {"scale_downs": [{"after_s": 300.0, "stopped": "w4"}],
                                  "back_to_least_s": 340.0}
    assert found["waits"]["step"] == {"jobs": 5, "p50_s": 4.0, "p95_s": 8.0, "max_s": 8.0,
                                      "within": 1.0}
    assert found["jobs"]["handed_on"] == 1 and found["missed"] == []


def test_a_lost_job_or_a_fleet_left_large_is_a_missed_goal():
    assert any("lost 1" in goal for goal in _run(lost=1)["missed"])
    assert any("not back to 1" in goal for goal in _run(ends_at_least=False)["missed"])
