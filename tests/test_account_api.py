"""``GET /v1/account`` as callers meet it: the real API server (``celery -A tasks lanes
api``), keys made in the suite's Redis, fast time recorded by real publishes."""
from __future__ import annotations

import time

import httpx
import pytest
from conftest import STATE_DIR

from tasks.broker.keys import FAST_PERIOD_KEY
from tasks.jobs import apikeys
from tasks.jobs.accounts import grant_fast_seconds
from tasks.jobs.plans import plan
from tests.harness.http import ApiServer


@pytest.fixture(scope="module")
def api(redis_server):
    with ApiServer(STATE_DIR / "logs" / "test_account_api") as server:
        yield server


@pytest.fixture
def http(api):
    with httpx.Client(base_url=api.url, timeout=30) as client:
        yield client


def bearer(clean_redis, account: str, plan_name: str = "standard") -> dict[str, str]:
    made, _ = apikeys.create(clean_redis, account, plan_name)
    return {"Authorization": f"Bearer {made}"}


def next_renewal(plan_name: str) -> float:
    period_s = plan(plan_name).period_s
    return float((int(time.time() // period_s) + 1) * period_s)


def test_without_a_live_key_it_is_401(http, clean_redis):
    refused = http.get("/v1/account")
    assert refused.status_code == 401 and "Bearer" in refused.headers["WWW-Authenticate"]
    assert "Authorization" in refused.json()["detail"]
    wrong = http.get("/v1/account", headers={"Authorization": "Bearer gl_not-a-key"})
    assert wrong.status_code == 401
    made, record = apikeys.create(clean_redis, "gone")
    apikeys.revoke(clean_redis, record.id)
    assert http.get("/v1/account", headers={"Authorization": f"Bearer {made}"}
                    ).status_code == 401


@pytest.mark.parametrize("plan_name", ["basic", "standard", "pro"])
def test_an_account_never_charged_has_its_plans_full_fast_time(http, clean_redis,
                                                               plan_name):
    terms = plan(plan_name)
    body = http.get("/v1/account", headers=bearer(clean_redis, "new-studio", plan_name))
    assert body.status_code == 200, body.text
    shown = body.json()
    assert (shown["account"], shown["plan"]) == ("new-studio", plan_name)
    assert shown["fast_seconds_left"] == terms.fast_seconds
    assert shown["fast_renews_at_unix"] == next_renewal(plan_name) > time.time()
    assert shown["fast_renews_at"].startswith(time.strftime(
        "%Y-%m-%dT%H:%M", time.gmtime(shown["fast_renews_at_unix"])))
    assert shown["limits"] == {"fast_seconds": terms.fast_seconds, "period_s": terms.period_s,
                               "concurrent_fast": terms.concurrent_fast,
                               "concurrent_jobs": terms.concurrent_jobs,
                               "queued_jobs": terms.queued_jobs, "relax": terms.relax}


def test_the_balance_is_what_this_period_left_and_a_new_period_renews_it(http, clean_redis):
    """A fast publish records the plan's period; what is charged in it is shown, spent
    time as 0, and a balance of an earlier period is the full fast time again (the next
    fast job renews it)."""
    headers = bearer(clean_redis, "busy-studio")
    full = plan("standard").fast_seconds
    queued = http.post("/v1/predictions", headers=headers,  # no worker: it stays queued
                       json={"model": "echo", "tier": "fast", "input": {"text": "hi"}})
    assert queued.status_code == 201, queued.text
    assert clean_redis.hget(FAST_PERIOD_KEY, "busy-studio") is not None
    grant_fast_seconds("busy-studio", -1000.5)

    def left() -> float:
        return http.get("/v1/account", headers=headers).json()["fast_seconds_left"]
    assert left() == full - 1000.5
    grant_fast_seconds("busy-studio", -full)
    assert left() == 0.0
    index, period_s, fast_s = clean_redis.hget(FAST_PERIOD_KEY, "busy-studio").split()
    clean_redis.hset(FAST_PERIOD_KEY, "busy-studio", f"{int(index) - 1} {period_s} {fast_s}")
    assert left() == full


def test_the_account_is_the_keys_own(http, clean_redis):
    mine, theirs = bearer(clean_redis, "mine"), bearer(clean_redis, "theirs", "pro")
    http.post("/v1/predictions", headers=theirs,
              json={"model": "echo", "tier": "fast", "input": {"text": "hi"}})
    grant_fast_seconds("theirs", -60)
    assert http.get("/v1/account", headers=mine).json()["fast_seconds_left"] == \
        plan("standard").fast_seconds
    assert http.get("/v1/account", headers=theirs).json()["fast_seconds_left"] == \
        plan("pro").fast_seconds - 60


def test_the_account_route_is_in_the_openapi_document(http):
    route = http.get("/openapi.json").json()["paths"]["/v1/account"]["get"]
    assert route["security"] and "fast" in route["description"]
    assert "/" not in http.get("/openapi.json").json()["paths"]  # the page is no API
