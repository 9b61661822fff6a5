"""A run's step guard decides at each boundary whether to step aside for a fast job:
only while the run expects to go on for ``preempt_min_left_s`` or more."""
from __future__ import annotations

import time

import pytest
from conftest import vary

from gpu_worker.lease import Lease
from gpu_worker.preempt import PREEMPTION, Preempted
from tasks.settings import settings
from tasks.worker.steps import StepGuard


class Reports:
    """Stands in for the run's ``Progress`` (ours): the steps it was told of."""

    def __init__(self, from_step: int = 0) -> None:
        self.from_step, self.steps = from_step, []

    def __call__(self, step: int, steps: int | None) -> None:
        self.steps.append(step)


def _guard(monkeypatch, pace_s: float, from_step: int = 0) -> tuple[StepGuard, list]:
    """A guard of a preemptible relaxed run that went ``pace_s`` per step so far, with
    a fast job waiting; the claims it makes."""
    claims: list[int] = []
    monkeypatch.setattr(PREEMPTION, "_claim", lambda heavier: claims.append(1) or 1)
    monkeypatch.setattr(PREEMPTION, "told_at", time.monotonic() + 1)
    monkeypatch.setattr(PREEMPTION, "asked_for", 0.0)
    guard = StepGuard("j1", Lease("j1", 1, "h#1#t", time.monotonic()), "relaxed", 0,
                      Reports(from_step))
    guard.preemptible = True
    guard.began = time.monotonic() - pace_s * 4
    return guard, claims


def test_a_run_with_long_left_steps_aside(monkeypatch):
    vary(monkeypatch, max_wait_s={"fast": 10.0})  # preempt_min_left_s: a tenth, 1 s
    guard, claims = _guard(monkeypatch, pace_s=0.1, from_step=0)
    with pytest.raises(Preempted):
        guard(4, 100)  # 96 steps of 0.1 s left
    assert claims == [1]


def test_a_run_about_to_end_runs_on_and_claims_nothing(monkeypatch):
    vary(monkeypatch, max_wait_s={"fast": 10.0})  # preempt_min_left_s: a tenth, 1 s
    guard, claims = _guard(monkeypatch, pace_s=0.1, from_step=0)
    guard(4, 10)  # 6 steps of 0.1 s: 0.6 s left
    assert claims == [] and guard.report.steps == [4]


def test_a_resumed_run_paces_from_where_it_resumed(monkeypatch):
    vary(monkeypatch, max_wait_s={"fast": 10.0})  # preempt_min_left_s: a tenth, 1 s
    guard, claims = _guard(monkeypatch, pace_s=0.1, from_step=90)
    guard(94, 100)  # 4 steps since resuming at 90, 6 left
    assert claims == []


@pytest.mark.parametrize("steps, handed", [(30, 0), (300, 1)])
def test_a_fast_run_hands_its_own_queues_fast_jobs_on_only_past_the_budget(
        monkeypatch, steps, handed):
    """A fast job behind a fast run (which nothing preempts) waits it out when it ends
    within the fast budget (2.6 s left of 10 s here); past it (29.6 s), it is handed to
    the shared lane."""
    vary(monkeypatch, max_wait_s={"fast": 10.0})
    handovers: list[int] = []
    monkeypatch.setattr(PREEMPTION, "_hand_over", lambda: handovers.append(1))
    monkeypatch.setattr(PREEMPTION, "told_at", time.monotonic() + 1)
    monkeypatch.setattr(PREEMPTION, "own_told_at", time.monotonic() + 1)
    monkeypatch.setattr(PREEMPTION, "asked_for", 0.0)
    guard = StepGuard("j1", Lease("j1", 1, "h#1#t", time.monotonic()), "fast", 0, Reports())
    guard.began = time.monotonic() - 0.1 * 4  # 0.1 s a step
    guard(4, steps)
    assert handovers == [1] * handed and guard.report.steps == [4]


def test_the_default_is_a_tenth_of_the_fast_budget():
    assert settings.preempt_min_left_s == pytest.approx(settings.max_wait_s["fast"] / 10)


def test_a_job_its_model_runs_briefly_stays_out_of_the_preemptible_index(monkeypatch):
    """A worker whose recent jobs of a model took less than the minimum time left does
    not offer the next one for preemption (it could never step aside)."""
    from gpu_worker.costfit import CostFit
    from gpu_worker.runtime import RUNTIME
    from tasks.broker.message import Job
    from tasks.worker.execute import _may_run_long

    vary(monkeypatch, max_wait_s={"fast": 10.0})  # preempt_min_left_s: a tenth, 1 s
    fits: dict[str, CostFit] = {}
    monkeypatch.setattr(RUNTIME, "cost_fits", fits)
    job = Job(tier="relaxed", account="a", model="demo", downgradable=True,
              inputs={"prompt": "p", "seed": 1, "steps": 4, "width": 64, "height": 64})
    assert _may_run_long(job)  # nothing seen yet
    fits["demo"] = CostFit()
    for _ in range(5):
        fits["demo"].add(1.0, 40.0)  # 40 ms jobs
    assert not _may_run_long(job)
    for _ in range(50):
        fits["demo"].add(1.0, 3000.0)  # 3 s jobs now
    assert _may_run_long(job)
