"""The scalers compared on a day of jobs (``python -m benchmarks.simulate --autoscale``):
small pools over a day compressed into two hours, a few seconds in all."""
from __future__ import annotations

import json
import math

import pytest

from benchmarks.simulate.__main__ import main
from benchmarks.simulate.config import SimConfig
from benchmarks.simulate.day import Day, trace
from benchmarks.simulate.elastic import Pool, View
from benchmarks.simulate.scalers import Clairvoyant, QueueLength, Signal

DAY = Day(hours=2.0)


@pytest.fixture(scope="module")
def jobs():
    return trace(DAY, 40, seed=3)


class Shrinking:
    """Three quarters of the pool leave every ten minutes, and come back five minutes
    later."""

    name, period_s = "shrinking", 1.0

    def __init__(self, size: int) -> None:
        self.size = size

    def wanted(self, view: View) -> int:
        return self.size // 4 if view.now % 600 < 300 else self.size


def test_the_day_has_its_night_its_peak_and_its_crowd():
    day = Day()
    assert day.load(4 * 3600) < 0.15 < 0.7 < day.load(20 * 3600)
    crowd = day.crowd_at_h * 3600
    assert day.load(crowd + 120) == pytest.approx(day.load(crowd - 1) + day.crowd_extra,
                                                  abs=0.01)


def test_a_pool_that_shrinks_hands_jobs_on_and_loses_no_work(jobs):
    """Workers stopped while busy hand their job on: every job starts once, and the
    pool's busy time is the jobs' run time exactly (no step lost, none run twice)."""
    pool = Pool(jobs, Shrinking(40), warm_s=75.0, least=1, most=40, start=40)
    outcome = pool.run()
    assert outcome.handed_over > 50
    assert sum(math.isfinite(w) for w in outcome.waits) == len(jobs)
    assert sum(pool.busy_s) == pytest.approx(sum(jobs.run_s), rel=1e-9)
    assert not pool.running and not pool.left_s and not any(pool.queues)
    assert all(1 <= wanted <= 40 and serving + starting <= 40
               for _, wanted, serving, starting in outcome.series)


def test_the_queue_length_scaler_keeps_within_the_hpa_tolerance():
    keda = QueueLength(target=2.0, cooldown_s=60.0)
    view = View(0.0, [0, 0, 0], [10, 5, 4], [0.0] * 3, [5.0] * 3, serving=10, starting=0)
    assert keda.wanted(view) == 10  # 19 jobs / 2 = 9.5: within 10 % of 10 workers
    view.now, view.queued = 15.0, [0, 0, 30]
    assert keda.wanted(view) == 20  # 49 / 2 = 25: at most double at a time
    view.now, view.queued, view.running = 30.0, [0, 0, 0], [1, 0, 0]
    assert keda.wanted(view) == 20  # down only to the most asked in the cooldown
    view.now = 91.0
    assert keda.wanted(view) == 1


def test_the_clairvoyant_provisions_each_minute_by_its_real_arrivals(jobs):
    seer = Clairvoyant(jobs, SimConfig().budgets_s, 75.0, 1, 40)
    night, evening = seer.plan[int(4 / 24 * 120)], seer.plan[int(20 / 24 * 120)]
    assert 1 <= night < evening <= 40
    busiest = max(range(len(seer.plan)), key=seer.plan.__getitem__)
    assert DAY.crowd_at_h / 24 * 120 <= busiest  # the crowd or the evening


def test_the_signal_meets_the_budgets_with_few_starts(jobs):
    start = Clairvoyant(jobs, SimConfig().budgets_s, 75.0, 1, 40).plan[0]
    signal = Signal(SimConfig().budgets_s, 75.0, 1, 40, state={"wanted": start})
    pool = Pool(jobs, signal, 75.0, 1, 40, start)
    outcome = pool.run()
    lanes = jobs.lane
    for lane, budget_s, share in ((0, 10.0, 0.999), (1, 60.0, 0.95)):
        mine = [w for w, k in zip(outcome.waits, lanes) if k == lane]
        assert sum(w <= budget_s for w in mine) / len(mine) >= share
    assert outcome.starts < 100  # it settles: no churn


def test_the_comparison_writes_its_figures(tmp_path):
    path = tmp_path / "autoscale.json"
    main(["--autoscale", "--gpus", "30", "--hours", "1", "--targets", "1,3",
          "--cooldowns", "60", "--processes", "1", "--json", str(path)])
    report = json.loads(path.read_text())
    assert set(report["runs"]) == {"clairvoyant", "gpulanes", "queue-length"}
    assert len(report["grid"]) == 2
    assert set(report["met"]) == {"fast", "standard", "gpu_hours_vs_clairvoyant",
                                  "ahead_of_queue_length"}
    for run in report["runs"].values():
        assert run["started"] == report["jobs"]
    assert report["series"]["gpulanes"]["fleet"]
