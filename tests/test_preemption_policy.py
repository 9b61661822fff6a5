"""When a running job steps aside for a fast one (``gpu_worker.preempt``): the decision
at each step boundary, with the Redis claim and hand-over counted (the real ones run in
tests/test_preempt.py)."""
from __future__ import annotations

import time

import pytest
from conftest import vary

from gpu_worker.preempt import MAX_SUSPENDED, Preemption, Suspended


@pytest.fixture
def news(monkeypatch):
    """A Preemption whose claim answers ``claims`` in turn; what it asked and handed."""
    found = Preemption()
    found.calls, found.handed, found.answers = [], [], []
    monkeypatch.setattr(found, "_claim", lambda: found.calls.append(1) or found.answers.pop(0))
    monkeypatch.setattr(found, "_hand_over", lambda: found.handed.append(1))
    return found


def tell(news, own: bool = False) -> None:
    news.told_at = time.monotonic() + len(news.calls) + len(news.handed) + 1e-3
    if own:
        news.own_told_at = news.told_at


def test_nothing_told_nothing_asked(news):
    assert not any(news.wanted("relaxed", 0) for _ in range(100)) and news.calls == []


def test_a_relaxed_run_asks_once_per_news_and_stops_when_it_wins_the_claim(news):
    tell(news)
    news.answers = [1]
    assert news.wanted("relaxed", 0) and news.claimed
    assert not news.wanted("relaxed", 0) and news.calls == [1]  # the same news: asked once
    tell(news)
    news.answers = [0]  # another worker claimed the job: run on
    assert not news.wanted("relaxed", 0) and not news.claimed


def test_a_standard_run_lets_one_step_pass_so_relaxed_runs_go_first(news):
    tell(news)
    news.answers = [1]
    assert not news.wanted("standard", 0) and news.calls == []
    assert news.wanted("standard", 0) and news.calls == [1]


def test_fast_runs_capped_runs_and_unpreemptible_runs_never_stop(news, monkeypatch):
    vary(monkeypatch, max_preemptions=2)
    for lane, preempted, preemptible in (("fast", 0, True), ("relaxed", 2, True),
                                         ("relaxed", 0, False)):
        tell(news)
        assert not news.wanted(lane, preempted, preemptible)
        tell(news, own=True)  # a fast job in this worker's own queue: handed on
        handed = len(news.handed)
        assert not news.wanted(lane, preempted, preemptible) and len(news.handed) == handed + 1
    vary(monkeypatch, preempt=False, max_preemptions=2)
    tell(news)
    assert not news.wanted("relaxed", 0) and news.calls == []


def test_suspended_states_are_bounded_and_taken_once():
    kept = Suspended()
    for i in range(MAX_SUSPENDED + 2):
        kept.keep(f"job-{i}", i, object())
    assert len(kept) == MAX_SUSPENDED and kept.take("job-0") is None  # the oldest dropped
    step, _ = kept.take(f"job-{MAX_SUSPENDED + 1}")
    assert step == MAX_SUSPENDED + 1 and kept.take(f"job-{MAX_SUSPENDED + 1}") is None


def test_own_queue_news_followed_by_shared_news_still_hands_over(news, monkeypatch):
    vary(monkeypatch, max_preemptions=1)
    tell(news, own=True)
    tell(news)  # shared news after it, before the next step boundary
    assert not news.wanted("relaxed", 1) and news.handed == [1]  # capped: handed on


def test_a_standard_run_claims_even_when_news_comes_every_step(news):
    news.answers = [1]
    tell(news)
    assert not news.wanted("standard", 0)  # its one step of grace
    tell(news)  # more news before the next boundary: no second grace
    assert news.wanted("standard", 0)
