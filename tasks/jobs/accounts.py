"""Fast-time accounting: each account has a balance of fast GPU seconds in Redis.

Only the run time of fast jobs that completed in the fast lane is charged;
queue time and failed runs are free. An account starts with
``GPULANES_FAST_SECONDS_DEFAULT``. When a charge brings it to zero or below,
the account joins the exhausted set that beat copies into the routers'
snapshot, and its fast jobs run in relaxed (reason ``fast_time_exhausted``)
until it is granted more. Every change is one atomic Lua script, so concurrent
charges never lose an update.

The snapshot lags a beat behind a charge, so the balance itself is read where a
fast job is admitted: the publish that takes its fast place
(``tasks.broker.enqueue``, ``publish.lua``) refuses it while the balance is at or
below zero, and the job is routed again as exhausted. What still runs past zero
is only what was admitted before: the account's fast jobs queued or running at
the moment its balance ran out (at most ``GPULANES_FAST_JOBS_PER_ACCOUNT``
queued, plus the running ones).
"""
from __future__ import annotations

import math

import redis

from tasks.broker import scripts
from tasks.broker.cell import share, within
from tasks.broker.keys import FAST_BALANCE_KEY, FAST_EXHAUSTED_KEY, FAST_PERIOD_KEY
from tasks.errors import InvalidJob
from tasks.jobs.schema import check_account
from tasks.settings import settings


def _client() -> redis.Redis:
    from tasks.broker.app import redis_client  # the app is built on first use only

    return redis_client()


def _add(account: str, seconds: float, client: redis.Redis | None = None) -> float:
    left = scripts.run(client or _client(), "fast_add", [FAST_BALANCE_KEY, FAST_EXHAUSTED_KEY],
                       [account, repr(float(seconds)),
                        repr(share(settings.fast_seconds_default))])
    return float(left)


def grant_fast_seconds(account: str, seconds: float) -> float:
    """Add ``seconds`` (may be negative) to ``account``'s balance; return what is left."""
    check_account(account)
    if isinstance(seconds, bool) or not isinstance(seconds, (int, float)) \
            or not math.isfinite(seconds):
        raise InvalidJob("seconds", f"must be a finite number, got {seconds!r}")
    return _add(account, seconds)


def fast_seconds_left(account: str) -> float:
    """Fast seconds ``account`` has left (the starting balance if never charged); with
    cells, its parts in all of them."""
    if not settings.cells:
        return _left(_client(), account)
    total = 0.0
    for name in settings.cells:
        with within(name):
            total += _left(_client(), account)
    return total


def _left(client: redis.Redis, account: str) -> float:
    left = client.hget(FAST_BALANCE_KEY, account)
    return share(settings.fast_seconds_default) if left is None else float(left)


def balances() -> dict[str, float]:
    """Every account with a recorded balance."""
    return {account: float(left) for account, left in _client().hgetall(FAST_BALANCE_KEY).items()}


def exhausted_accounts() -> set[str]:
    """Accounts whose fast time is spent (their fast jobs run in relaxed)."""
    return set(_client().smembers(FAST_EXHAUSTED_KEY))


#: Exhausted accounts beat looks at per round for a new period.
RENEW_BATCH = 500


def renew_spent(client: redis.Redis, now: float) -> int:
    """Beat's round: a plan's account whose fast time is spent gets its fast seconds back
    once its period has turned (a publish renews an account only when it sends a fast
    job, which routing sends elsewhere while the account is listed as spent). Returns
    how many were renewed."""
    accounts = [_text(a) for a in client.srandmember(FAST_EXHAUSTED_KEY, RENEW_BATCH) or ()]
    if not accounts:
        return 0
    periods = client.hmget(FAST_PERIOD_KEY, accounts)
    renewed = 0
    for account, period in zip(accounts, periods):
        if period is None:
            continue  # not on a plan: granted by an operator
        index, period_s, fast_s = _text(period).split()
        current = int(now // float(period_s))
        if current > int(index):
            renewed += int(scripts.run(client, "fast_renew",
                                       [FAST_BALANCE_KEY, FAST_PERIOD_KEY, FAST_EXHAUSTED_KEY],
                                       [account, _text(period), f"{current} {period_s} {fast_s}"]))
    return renewed


def _text(value: str | bytes) -> str:
    return value.decode() if isinstance(value, bytes) else value
