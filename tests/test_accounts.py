"""Fast-time balances: atomic under concurrency, exhausted set kept in step."""
from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import pytest

from tasks.broker.keys import FAST_EXHAUSTED_KEY
from tasks.errors import InvalidJob
from tasks.jobs.accounts import exhausted_accounts, fast_seconds_left, grant_fast_seconds
from tasks.settings import settings


def test_new_account_starts_with_the_default(clean_redis):
    assert fast_seconds_left("newcomer") == settings.fast_seconds_default


def test_concurrent_charges_never_lose_an_update(clean_redis):
    grant_fast_seconds("busy", 100 - settings.fast_seconds_default)

    def charge(_: int) -> None:  # 8 threads at once, each on a connection of the pool
        for _ in range(50):
            grant_fast_seconds("busy", -0.25)

    with ThreadPoolExecutor(8) as pool:
        list(pool.map(charge, range(8)))
    assert fast_seconds_left("busy") == pytest.approx(0.0)  # 100 - 8 * 50 * 0.25
    assert "busy" in exhausted_accounts()


def test_grant_clears_exhaustion_and_checks_its_input(clean_redis):
    grant_fast_seconds("a", -settings.fast_seconds_default - 1)
    assert clean_redis.sismember(FAST_EXHAUSTED_KEY, "a")
    assert grant_fast_seconds("a", 10) == pytest.approx(9.0)
    assert "a" not in exhausted_accounts()
    for bad in ("12", None, True, float("nan"), float("inf")):
        with pytest.raises(InvalidJob) as caught:
            grant_fast_seconds("a", bad)
        assert caught.value.field == "seconds"
    with pytest.raises(InvalidJob) as caught:
        grant_fast_seconds("bad account", 1)
    assert caught.value.field == "account"
