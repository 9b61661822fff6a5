"""API keys and plans (``tasks.jobs.apikeys``, ``tasks.jobs.plans``), and the
``lanes keys`` commands run for real."""
from __future__ import annotations

import json
import time

import pytest
from test_cli import failed, ok

from tasks.broker.keys import API_KEYS_KEY
from tasks.errors import InvalidJob
from tasks.jobs import apikeys
from tasks.jobs.plans import PLANS, plan


def test_a_key_names_its_account_and_plan_and_only_its_hash_is_stored(clean_redis):
    key, record = apikeys.create(clean_redis, "studio-7", "pro")
    assert key.startswith("gl_") and len(key) == 46
    assert apikeys.lookup(clean_redis, key) == record
    assert (record.account, record.plan) == ("studio-7", "pro")
    stored = {k.decode(): v.decode() for k, v in clean_redis.hgetall(API_KEYS_KEY).items()}
    assert key not in json.dumps(stored) and list(stored) == [apikeys.digest(key)]
    other, _ = apikeys.create(clean_redis, "studio-7")
    assert other != key and apikeys.lookup(clean_redis, other).plan == "standard"


@pytest.mark.parametrize("value", [None, 42, "", "gl_", "gl_" + "x" * 43, "sk_" + "x" * 43,
                                   "gl_" + "y" * 500])
def test_anything_but_a_live_key_is_no_key(clean_redis, value):
    apikeys.create(clean_redis, "someone")
    assert apikeys.lookup(clean_redis, value) is None


def test_a_revoked_key_is_no_key_and_its_revocation_is_announced(clean_redis):
    key, record = apikeys.create(clean_redis, "leaving")
    heard = clean_redis.pubsub(ignore_subscribe_messages=True)
    heard.subscribe("gpulanes:apikeys:revoked")
    heard.get_message(timeout=1.0)
    assert apikeys.revoke(clean_redis, record.id) == record
    assert apikeys.lookup(clean_redis, key) is None
    message = heard.get_message(timeout=2.0)
    assert message and message["data"].decode() == apikeys.digest(key)
    with pytest.raises(InvalidJob, match="key"):
        apikeys.revoke(clean_redis, key)  # already revoked


def test_bad_accounts_and_plans_are_refused_naming_the_field(clean_redis):
    with pytest.raises(InvalidJob, match="account"):
        apikeys.create(clean_redis, "no spaces allowed")
    with pytest.raises(InvalidJob, match="plan"):
        apikeys.create(clean_redis, "fine", "platinum")
    assert not clean_redis.exists(API_KEYS_KEY)


def test_plans_follow_the_tiered_services_they_model():
    assert not plan("basic").relax and all(plan(n).relax for n in ("standard", "pro", "mega"))
    assert [plan(n).concurrent_fast for n in PLANS] == [3, 3, 12, 12]
    assert sorted(PLANS, key=lambda n: plan(n).fast_seconds) == list(PLANS)


def test_the_keys_commands(clean_redis):
    made = json.loads(ok("keys", "create", "cli-acct", "--plan", "mega", "--json"))
    assert made["account"] == "cli-acct" and made["plan"] == "mega"
    assert made["key"] not in ok("keys", "list") and made["id"] in ok("keys", "list")
    assert "revoked key" in ok("keys", "revoke", made["id"])
    assert "no API keys" in ok("keys", "list")
    assert "plan" in failed("keys", "create", "cli-acct", "--plan", "gold")


def test_a_kept_key_is_refused_at_once_when_revoked(clean_redis):
    """A process that keeps the keys it has seen drops one as its revocation is
    announced; while it cannot hear revocations, it keeps nothing."""
    key, record = apikeys.create(clean_redis, "kept")
    kept = apikeys.KeyCache(clean_redis)
    try:
        assert kept.listening.wait(5)
        assert kept.lookup(key) == record
        before = clean_redis.info("commandstats").get("cmdstat_hget", {}).get("calls", 0)
        assert kept.lookup(key) == record  # from memory: no read
        assert clean_redis.info("commandstats").get("cmdstat_hget", {}).get("calls", 0) == before
        apikeys.revoke(clean_redis, key)
        deadline = time.monotonic() + 2
        while kept.lookup(key) is not None:
            assert time.monotonic() < deadline, "a revoked key was still served"
            time.sleep(0.01)
        other, _ = apikeys.create(clean_redis, "kept")
        kept.listening.clear()  # as while its subscription is down
        assert kept.lookup(other) is not None
        clean_redis.hdel(API_KEYS_KEY, apikeys.digest(other))  # revoked, unheard
        assert kept.lookup(other) is None  # read from Redis, not memory
        assert kept.lookup("gl_nope") is None and kept.lookup(None) is None
    finally:
        kept.close()
