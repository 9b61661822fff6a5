"""Fast-time accounting: each account has a balance of fast GPU seconds in Redis.

Only the run time of fast jobs that completed in the fast lane is charged;
queue time and failed runs are free. An account starts with
``GPULANES_FAST_SECONDS_DEFAULT``. When a charge brings it to zero or below,
the account joins the exhausted set that routers read, and its fast jobs run
in relaxed (reason ``fast_time_exhausted``) until it is granted more. Every
change is one atomic Lua script, so concurrent charges never lose an update.
"""
from __future__ import annotations

import math
from functools import lru_cache
from typing import Any

import redis

import celeryconfig as cfg
from routing.names import FAST_BALANCE_KEY, FAST_EXHAUSTED_KEY
from tasks.errors import InvalidJob
from tasks.schema import check_account

#: Lua: ``add(balances, exhausted, account, delta, starting balance)`` -> what is left;
#: an account at zero or below joins the exhausted set, one above leaves it.
ADD_FUNCTION = """
local function add(balances, exhausted, account, delta, start)
  local left = redis.call('HGET', balances, account)
  if not left then left = start end
  left = tonumber(left) + tonumber(delta)
  redis.call('HSET', balances, account, tostring(left))
  if left <= 0 then redis.call('SADD', exhausted, account)
  else redis.call('SREM', exhausted, account) end
  return tostring(left)
end
"""
# KEYS: balance hash, exhausted set. ARGV: account, delta, starting balance.
_ADD = ADD_FUNCTION + "return add(KEYS[1], KEYS[2], ARGV[1], ARGV[2], ARGV[3])"


def _client() -> redis.Redis:
    from tasks.celeryapp import redis_client  # the app is built on first use only

    return redis_client()


@lru_cache(maxsize=8)
def _add_script(client: redis.Redis) -> Any:
    return client.register_script(_ADD)  # hashed once per client, not per charge


def _add(account: str, seconds: float, client: redis.Redis | None = None) -> float:
    client = client or _client()
    left = _add_script(client)(keys=[FAST_BALANCE_KEY, FAST_EXHAUSTED_KEY],
                               args=[account, repr(float(seconds)),
                                     repr(cfg.FAST_SECONDS_DEFAULT)])
    return float(left)


def grant_fast_seconds(account: str, seconds: float) -> float:
    """Add ``seconds`` (may be negative) to ``account``'s balance; return what is left."""
    check_account(account)
    if isinstance(seconds, bool) or not isinstance(seconds, (int, float)) \
            or not math.isfinite(seconds):
        raise InvalidJob("seconds", f"must be a finite number, got {seconds!r}")
    return _add(account, seconds)


def charge_fast_seconds(account: str, seconds: float, client: redis.Redis | None = None) -> float:
    """Charge a completed fast run; returns the balance left."""
    return _add(account, -abs(seconds), client)


def fast_seconds_left(account: str) -> float:
    """Fast seconds ``account`` has left (the starting balance if never charged)."""
    left = _client().hget(FAST_BALANCE_KEY, account)
    return cfg.FAST_SECONDS_DEFAULT if left is None else float(left)


def balances() -> dict[str, float]:
    """Every account with a recorded balance."""
    return {account: float(left) for account, left in _client().hgetall(FAST_BALANCE_KEY).items()}


def exhausted_accounts() -> set[str]:
    """Accounts whose fast time is spent (their fast jobs run in relaxed)."""
    return set(_client().smembers(FAST_EXHAUSTED_KEY))
