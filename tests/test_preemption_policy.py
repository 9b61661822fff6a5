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
    monkeypatch.setattr(found, "_claim",
                        lambda heavier: found.calls.append(heavier) or found.answers.pop(0))
    monkeypatch.setattr(found, "_hand_over", lambda: found.handed.append(1))
    return found


def tell(news, own: bool = False, fast: bool = True) -> None:
    """News of a fast job (``own``: in this worker's own queue), or (not ``fast``) of a
    first-level standard job in its own queue."""
    news.told_at = time.monotonic() + len(news.calls) + len(news.handed) + 1e-3
    if fast:
        news.fast_told_at = news.told_at
    if own and fast:
        news.own_told_at = news.told_at


def test_nothing_told_nothing_asked(news):
    assert not any(news.wanted("relaxed", 0) for _ in range(100)) and news.calls == []


def test_a_relaxed_run_asks_once_per_news_and_stops_when_it_wins_the_claim(news):
    tell(news)
    news.answers = [1]
    assert news.wanted("relaxed", 0) and news.claimed
    assert not news.wanted("relaxed", 0) and news.calls == [False]  # the same news: once
    tell(news)
    news.answers = [0]  # another worker claimed the job: run on
    assert not news.wanted("relaxed", 0) and not news.claimed


def test_a_standard_run_told_of_a_fast_job_claims_at_its_next_boundary(news):
    tell(news)  # told: no relaxed run was there to take it (fast_news picks those first)
    news.answers = [1]
    assert news.wanted("standard", 0) and news.calls == [False]


def test_a_heavier_run_told_of_a_first_level_job_asks_for_its_own_queue_too(news):
    tell(news, own=True, fast=False)
    news.answers = [1]
    assert news.wanted("standard", 0, heavier=True) and news.calls == [True]
    assert news.handed == []  # not a fast job: nothing to hand over


def test_a_first_level_run_does_not_ask_for_first_level_news(news):
    tell(news, own=True, fast=False)
    assert not news.wanted("standard", 0, heavier=False) and news.calls == []
    tell(news)  # a fast job: asked, for the fast lists alone
    news.answers = [0]
    assert not news.wanted("standard", 0, heavier=False) and news.calls == [False]


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


def test_a_run_that_may_not_stop_keeps_its_fast_jobs_when_it_ends_within_budget(
        news, monkeypatch):
    vary(monkeypatch, max_wait_s={"fast": 10.0})
    for left_s, handed in ((9.9, 0), (10.0, 1), (None, 2)):  # None: not known, handed
        tell(news, own=True)
        assert not news.wanted("fast", 0, True, left_s) and len(news.handed) == handed


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


def test_each_fast_job_is_told_to_one_worker_relaxed_runs_first(clean_redis):
    from conftest import SMALL

    from tasks import submit
    from tasks.broker.keys import PREEMPTIBLE_KEY, fast_news_channel

    hosts = ["gpu0@std", "gpu1@relaxed-old", "gpu2@relaxed-new", "gpu3@idle"]
    pubsub = clean_redis.pubsub(ignore_subscribe_messages=True)
    pubsub.subscribe(*map(fast_news_channel, hosts))
    clean_redis.zadd(PREEMPTIBLE_KEY, {"gpu0@std": 1.1, "gpu1@relaxed-old": 2.1,
                                       "gpu2@relaxed-new": 2.2})

    def told() -> list[str]:  # what the channels carried over the next half second
        heard, until = [], time.monotonic() + 0.5
        while time.monotonic() < until:
            if message := pubsub.get_message(timeout=0.05):
                heard.append(message["channel"].decode().rsplit(":", 1)[1])
        return heard

    told()
    for _ in range(4):
        submit("p", tier="fast", **SMALL)
    assert told() == ["gpu2@relaxed-new", "gpu1@relaxed-old", "gpu0@std"]  # then nobody
    assert clean_redis.zcard(PREEMPTIBLE_KEY) == 0
    submit("p", tier="relaxed", **SMALL)  # no news for other lanes
    assert told() == []
