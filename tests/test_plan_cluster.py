"""A plan's limits and Cancel-After on real worker processes: an account's jobs run at
most its concurrent jobs at once, each letting the next parked one in as it ends; a job
still queued at its Cancel-After never runs and is not charged."""
from __future__ import annotations

import time

import pytest
from conftest import SMALL, new_gate, wait_at_gate, wait_until

from tasks import submit
from tasks.broker.keys import FAST_BALANCE_KEY, admitted_key, parked_key
from tasks.jobs.plans import Plan
from tests.flaky_model import open_gate

pytestmark = pytest.mark.cluster

ONE_AT_A_TIME = Plan(name="one", fast_seconds=3600, concurrent_fast=1, concurrent_jobs=1,
                     queued_jobs=10)


@pytest.fixture(scope="module")
def cluster(cluster_factory):
    return cluster_factory(workers=2)


def test_an_accounts_jobs_run_one_at_a_time_on_two_free_workers(cluster, clean_redis):
    results = [submit("p", account="acme", plan=ONE_AT_A_TIME, **SMALL) for _ in range(4)]
    done = [r.get(timeout=60) for r in results]
    spans = sorted((d["started_at"], d["started_at"] + d["run_ms"] / 1000) for d in done)
    assert all(end <= start for (_, end), (start, _) in zip(spans, spans[1:])), spans
    wait_until(lambda: clean_redis.zcard(admitted_key("acme")) == 0, 10,
               what="the last admission to be released")
    assert clean_redis.llen(parked_key("acme")) == 0


def test_a_job_still_queued_at_its_cancel_after_never_runs_and_is_not_charged(
        cluster, clean_redis):
    gate = new_gate()
    holding = submit(f"gate:{gate} hold", model="flaky", account="acme", plan=ONE_AT_A_TIME,
                     **SMALL)
    wait_at_gate(holding, gate)
    late = submit("p", tier="fast", account="acme", plan=ONE_AT_A_TIME, cancel_after=0.5,
                  **SMALL)
    balance = float(clean_redis.hget(FAST_BALANCE_KEY, "acme"))
    time.sleep(0.6)  # its deadline passes while it waits behind the held job
    open_gate(gate)
    holding.get(timeout=60)
    wait_until(lambda: late.state == "REVOKED", 30, what="the late job to be revoked")
    assert float(clean_redis.hget(FAST_BALANCE_KEY, "acme")) == balance
    wait_until(lambda: clean_redis.zcard(admitted_key("acme")) == 0, 10,
               what="its admission to be released")

