"""A plan's limits, idempotency keys, Cancel-After and prediction records, as the publish
keeps them on the real Redis (no worker: what the lanes hold is counted directly)."""
from __future__ import annotations

import multiprocessing
import time
from dataclasses import replace

import pytest

from tasks import submit
from tasks.broker.keys import (
    FAST_BALANCE_KEY,
    FAST_EXHAUSTED_KEY,
    FAST_PERIOD_KEY,
    LANE_DEPTHS_KEY,
    PARKED_ACCOUNTS_KEY,
    admitted_key,
    parked_key,
)
from tasks.errors import FastTimeSpent, InvalidJob, OverLimit
from tasks.jobs import admission, predictions
from tasks.jobs.accounts import renew_spent
from tasks.jobs.plans import PLANS, Plan

SMALL = dict(steps=2, width=64, height=64)
#: Two jobs at once (one of them fast), three more waiting behind them.
TIGHT = Plan(name="tight", fast_seconds=3600, concurrent_fast=1, concurrent_jobs=2,
             queued_jobs=3)


def depth(client, lane: str = "standard") -> int:
    return int(client.hget(LANE_DEPTHS_KEY, lane) or 0)


def test_a_plan_admits_its_concurrent_jobs_parks_its_queue_and_refuses_past_it(clean_redis):
    ids = [submit("p", account="acme", plan=TIGHT, **SMALL).id for _ in range(5)]
    assert depth(clean_redis) == 2  # admitted to the lane
    assert clean_redis.llen(parked_key("acme")) == 3
    with pytest.raises(OverLimit) as refused:
        submit("p", account="acme", plan=TIGHT, **SMALL)
    assert refused.value.limit == "queued_jobs" and refused.value.retry_after_s > 0
    assert depth(clean_redis) == 2 and clean_redis.llen(parked_key("acme")) == 3
    # another account is not held by acme's limits
    submit("p", account="other", plan=TIGHT, **SMALL)
    assert depth(clean_redis) == 3
    # one of acme's jobs is over: the first parked one enters its lane, in its turn
    assert admission.over(clean_redis, "acme", ids[0]) == 1
    assert depth(clean_redis) == 4 and clean_redis.llen(parked_key("acme")) == 2
    admitted = {m.decode() for m in clean_redis.zrange(admitted_key("acme"), 0, -1)}
    assert admitted == {ids[1], ids[2]}
    assert admission.over(clean_redis, "acme", ids[1], ids[2]) == 2
    assert admission.over(clean_redis, "acme", ids[3]) == 0
    assert admission.over(clean_redis, "acme", ids[4]) == 0
    assert not clean_redis.sismember(PARKED_ACCOUNTS_KEY, "acme")  # none parked any more


def test_a_fast_job_past_the_concurrent_fast_jobs_waits_its_turn(clean_redis):
    first = submit("p", tier="fast", account="acme", plan=TIGHT, **SMALL)
    submit("p", tier="fast", account="acme", plan=TIGHT, **SMALL)
    assert depth(clean_redis, "fast") == 1 and clean_redis.llen(parked_key("acme")) == 1
    # a standard job behind it waits too: the account's line keeps its order
    submit("p", account="acme", plan=TIGHT, **SMALL)
    assert depth(clean_redis) == 0 and clean_redis.llen(parked_key("acme")) == 2
    assert admission.over(clean_redis, "acme", first.id) == 2  # (its message stays queued)
    assert depth(clean_redis, "fast") == 2 and depth(clean_redis) == 1


def test_beat_lets_parked_jobs_in_when_a_job_ended_unannounced(clean_redis):
    from tasks.broker.keys import done_key

    ids = [submit("p", account="acme", plan=TIGHT, **SMALL).id for _ in range(3)]
    assert admission.sweep(clean_redis) == 0  # both admitted jobs still in flight
    clean_redis.set(done_key(ids[0]), "{}")  # its worker died before saying it was over
    assert admission.sweep(clean_redis) == 1
    assert depth(clean_redis) == 3


def _submit_many(account: str, count: int, start: float, found: "multiprocessing.Queue") -> None:
    from tasks import submit as submit_
    from tasks.errors import OverLimit as over_limit

    while time.time() < start:
        time.sleep(0.001)
    accepted = refused = 0
    for _ in range(count):
        try:
            submit_("p", account=account, plan=TIGHT, **SMALL)
            accepted += 1
        except over_limit:
            refused += 1
    found.put((accepted, refused))


def test_limits_hold_exactly_under_submits_from_several_processes(clean_redis):
    found = multiprocessing.get_context("spawn").Queue()
    start = time.time() + 2.0
    workers = [multiprocessing.get_context("spawn").Process(
        target=_submit_many, args=("acme", 10, start, found)) for _ in range(3)]
    for process in workers:
        process.start()
    results = [found.get(timeout=60) for _ in workers]
    for process in workers:
        process.join(10)
    assert sum(a for a, _ in results) == TIGHT.concurrent_jobs + TIGHT.queued_jobs
    assert sum(r for _, r in results) == 30 - 5
    assert depth(clean_redis) == TIGHT.concurrent_jobs


def test_an_idempotency_key_makes_one_job(clean_redis):
    first = submit("p", account="acme", idempotency_key="order-17", **SMALL)
    again = submit("p", account="acme", idempotency_key="order-17", **SMALL)
    assert again.id == first.id and depth(clean_redis) == 1
    other = submit("p", account="bob", idempotency_key="order-17", **SMALL)  # per account
    assert other.id != first.id and depth(clean_redis) == 2


def test_a_refused_job_takes_no_idempotency_key(clean_redis):
    for _ in range(5):
        submit("p", account="acme", plan=TIGHT, **SMALL)
    with pytest.raises(OverLimit):
        submit("p", account="acme", plan=TIGHT, idempotency_key="k", **SMALL)
    admission.over(clean_redis, "acme", *[m.decode() for m in
                                          clean_redis.zrange(admitted_key("acme"), 0, -1)])
    made = submit("p", account="acme", plan=TIGHT, idempotency_key="k", **SMALL)
    assert made.id == submit("p", account="acme", plan=TIGHT, idempotency_key="k", **SMALL).id


def _submit_same(start: float, found: "multiprocessing.Queue") -> None:
    from tasks import submit as submit_

    while time.time() < start:
        time.sleep(0.0005)
    found.put(submit_("p", account="acme", idempotency_key="together", **SMALL).id)


def test_two_processes_with_one_idempotency_key_get_one_job(clean_redis):
    ctx = multiprocessing.get_context("spawn")
    found, start = ctx.Queue(), time.time() + 2.0
    processes = [ctx.Process(target=_submit_same, args=(start, found)) for _ in range(2)]
    for process in processes:
        process.start()
    ids = {found.get(timeout=60) for _ in processes}
    for process in processes:
        process.join(10)
    assert len(ids) == 1 and depth(clean_redis) == 1


@pytest.mark.parametrize("field, value", [("idempotency_key", ""), ("idempotency_key", 7),
                                          ("cancel_after", 0), ("cancel_after", "soon"),
                                          ("cancel_after", float("inf")), ("plan", "pro")])
def test_bad_keywords_are_refused_naming_them(field, value, clean_redis):
    with pytest.raises(InvalidJob) as refused:
        submit("p", **{field: value}, **SMALL)
    assert refused.value.field == field
    assert depth(clean_redis) == 0


def test_cancel_after_sets_the_message_expiry(clean_redis):
    from tasks.broker.keys import list_key

    submit("p", account="acme", cancel_after=30, **SMALL)
    from kombu.utils.json import loads

    message = loads(clean_redis.lindex(list_key("standard", 1), 0))  # level 0's list
    expires = message["headers"]["expires"]
    assert expires and "T" in expires  # ISO 8601, about 30 s from now


def test_a_plan_without_relax_and_no_fast_time_left_is_refused_with_its_renewal(clean_redis):
    basic = PLANS["basic"]
    clean_redis.hset(FAST_BALANCE_KEY, "acme", 0)
    period = int(time.time() // basic.period_s)
    clean_redis.hset(FAST_PERIOD_KEY, "acme", f"{period} {basic.period_s} {basic.fast_seconds!r}")
    with pytest.raises(FastTimeSpent) as refused:
        submit("p", tier="fast", account="acme", plan=basic, **SMALL)
    assert refused.value.renews_at == (period + 1) * basic.period_s
    with pytest.raises(InvalidJob) as relaxed:
        submit("p", tier="relaxed", account="acme", plan=basic, **SMALL)
    assert relaxed.value.field == "tier"
    # a plan with relax runs it there
    result = submit("p", tier="fast", account="acme", plan=PLANS["standard"], **SMALL)
    assert result.id and depth(clean_redis, "relaxed") == 1


def test_a_new_period_renews_fast_time(clean_redis):
    plan = PLANS["pro"]
    now = time.time()
    old = int(now // plan.period_s) - 1
    clean_redis.hset(FAST_BALANCE_KEY, "acme", -5)
    clean_redis.hset(FAST_PERIOD_KEY, "acme", f"{old} {plan.period_s} {plan.fast_seconds!r}")
    clean_redis.sadd(FAST_EXHAUSTED_KEY, "acme")
    assert renew_spent(clean_redis, now) == 1
    assert float(clean_redis.hget(FAST_BALANCE_KEY, "acme")) == plan.fast_seconds
    assert not clean_redis.sismember(FAST_EXHAUSTED_KEY, "acme")
    # a publish of a fast job renews an account that is not listed as spent
    clean_redis.hset(FAST_BALANCE_KEY, "bob", 1.5)
    clean_redis.hset(FAST_PERIOD_KEY, "bob", f"{old} {plan.period_s} {plan.fast_seconds!r}")
    submit("p", tier="fast", account="bob", plan=plan, **SMALL)
    assert float(clean_redis.hget(FAST_BALANCE_KEY, "bob")) == plan.fast_seconds


def test_a_plans_jobs_are_recorded_for_their_account_only(clean_redis):
    made = [submit("p", account="acme", plan=PLANS["pro"], **SMALL).id for _ in range(3)]
    submit("p", account="bob", plan=PLANS["pro"], **SMALL)
    mine = predictions.owned(clean_redis, "acme", made[0])
    assert mine is not None and mine.model == "demo" and mine.input["prompt"] == "p"
    assert mine.lane == "standard" and not mine.parked
    assert predictions.owned(clean_redis, "bob", made[0]) is None
    listed = predictions.listed(clean_redis, "acme")
    assert [p.id for p in listed] == made[::-1]  # newest first
    assert [p.id for p in predictions.listed(clean_redis, "acme", 1, 1)] == [made[1]]
    assert predictions.position(clean_redis, mine) == 0
    assert predictions.position(clean_redis, predictions.owned(clean_redis, "acme", made[2])) == 2


def test_a_placed_submit_answers_the_prediction_it_recorded_and_its_place(clean_redis):
    from tasks.api import submit_placed

    (first, made), (second, _) = (submit_placed("p", account="acme", plan=TIGHT, **SMALL)
                                  for _ in range(2))
    assert (first.lane, first.position, second.position) == ("standard", 0, 1)
    read = predictions.owned(clean_redis, "acme", first.job_id)
    assert made == replace(read, entered=0.0) and made.input["seed"] == read.input["seed"]
    parked, held = submit_placed("p", account="acme", plan=TIGHT, **SMALL)
    assert parked.parked and parked.position is None and held.parked
    same, _ = submit_placed("p", account="bob", plan=TIGHT, idempotency_key="k", **SMALL)
    again, none = submit_placed("p", account="bob", plan=TIGHT, idempotency_key="k", **SMALL)
    assert again.job_id == same.job_id and none is None


@pytest.mark.parametrize("tier", ["fast", "standard"])
def test_redis_out_of_memory_refuses_a_plans_job_leaving_nothing(tier, clean_redis):
    """The publish's first write is one Redis refuses while out of memory, so the whole
    publish is refused: no place, no admission, no record, no idempotency key."""
    from tasks.errors import BrokerRefused
    from tests.harness.refusals import out_of_memory

    with out_of_memory(clean_redis):
        with pytest.raises(BrokerRefused):
            submit("p", tier=tier, account="acme", plan=TIGHT, idempotency_key="k", **SMALL)
    assert not [k for k in clean_redis.scan_iter() if b"acme" in k or b"depths" in k]
