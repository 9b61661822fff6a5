"""The per-trial figures of ``benchmarks/overload.py``, on hand-made outcomes."""
from __future__ import annotations

from benchmarks.overload_plan import Budgets
from benchmarks.overload_report import (SLOW_BIN_S, slow_s, trial_row, trial_table,
                                       window_served)
from benchmarks.overload_trial import Trial


def result(started_at: float, run_ms: float, queued_ms: float = 0.0) -> dict:
    return {"started_at": started_at, "run_ms": run_ms, "queued_ms": queued_ms,
            "worker": "w", "lane": "fast"}


def test_a_slow_stretch_is_the_time_its_runs_took_far_longer_than_the_median():
    steady = [result(i * 0.05, 30.0) for i in range(200)]  # 10 s of 30 ms runs
    slowed = [dict(r, run_ms=60.0) for r in steady if 4.0 <= r["started_at"] < 5.0]
    done = [r for r in steady if not 4.0 <= r["started_at"] < 5.0] + slowed
    assert slow_s(steady) == 0.0
    assert slow_s(done) == 2 * SLOW_BIN_S  # the two bins of that second
    assert slow_s([]) == 0.0


def test_a_trial_row_gives_fast_and_standard_within_budget_and_its_slow_time():
    budgets = Budgets.from_capacity(40.0, 2)  # job 50 ms: fast 0.5 s, standard 3 s
    trial = Trial("gpulanes")
    trial.offered, trial.submit_s, trial.drain_s = 40, 1.0, 1.0
    trial.outcomes = (
        [{"tier": "fast", "state": "done", "result": result(i * 0.05, 30.0, 100.0)}
         for i in range(9)]
        + [{"tier": "fast", "state": "done", "result": result(0.5, 30.0, 900.0)}]
        + [{"tier": "standard", "state": "done", "result": result(0.6 + i * 0.05, 30.0, q)}
           for i, q in enumerate([1000.0, 5000.0])])
    row = trial_row(trial, budgets, {"fast": 0.3, "standard": 0.4, "relaxed": 0.3})
    assert row["fast_within"] == 0.9 and row["standard_within"] == 0.5
    assert row["served_jobs_s"] == 6.0 and row["slow_s"] == 0.0
    assert "90.0%" in trial_table([row])


def test_the_load_met_counts_what_the_pool_served_while_jobs_were_offered():
    budgets = Budgets.from_capacity(40.0, 2)
    trial = Trial("plain")
    # 40 jobs published over 1 s (40/s); 20 started in that second, 20 more in the next
    trial.offered, trial.submit_s, trial.drain_s = 40, 1.0, 1.0
    trial.outcomes = [{"tier": "relaxed", "state": "done",
                       "result": result(i * 0.05, 30.0, (i * 0.05 - i * 0.025) * 1000)}
                      for i in range(40)]
    assert abs(window_served([o["result"] for o in trial.outcomes]) - 20 / 0.975) < 1e-6
    row = trial_row(trial, budgets, {"fast": 0.3, "standard": 0.4, "relaxed": 0.3})
    assert abs(row["load"] - 1.95) < 1e-6  # 40/s against the 20.5/s served while offering
    assert row["load_with_drain"] == 2.0  # against the 20/s over window and drain
    assert window_served([]) == 0.0
