"""``GET /v1/account``: the caller's account, its plan's limits and its fast time now.

An account's fast seconds are renewed at the start of each of its plan's periods
(``tasks.jobs.plans``). The publish of a fast job renews them (``publish.lua``); beat
renews a spent account's. So a balance recorded in an earlier period, or none at all,
is the plan's full fast seconds: that is what the next fast job finds.
"""
from __future__ import annotations

import time
from typing import Any

import redis
from fastapi import APIRouter, Depends

from tasks.broker import cells
from tasks.broker.cell import share
from tasks.broker.keys import FAST_BALANCE_KEY, FAST_PERIOD_KEY
from tasks.front.auth import caller
from tasks.front.errors import iso
from tasks.jobs.apikeys import ApiKey
from tasks.jobs.plans import Plan, plan

router = APIRouter(prefix="/v1", tags=["account"])
#: What ``limits`` shows of the account's plan.
LIMIT_FIELDS = ("fast_seconds", "period_s", "concurrent_fast", "concurrent_jobs",
                "queued_jobs", "relax")


def period_index(terms: Plan, now: float) -> int:
    """The number of the plan's period that ``now`` (Unix s) falls in."""
    return int(now // terms.period_s)


def fast_seconds_left(client: redis.Redis, account: str, terms: Plan, now: float,
                      full: float | None = None) -> float:
    """Fast seconds ``account`` has left in the plan's current period on ``client``'s
    Redis, ``full`` (default: the plan's) where the period has not begun there yet; with
    cells, one cell's part, below 0 where the account overshot there."""
    with client.pipeline(transaction=True) as pipe:
        pipe.hget(FAST_BALANCE_KEY, account)
        pipe.hget(FAST_PERIOD_KEY, account)
        balance, period = pipe.execute()
    current = f"{period_index(terms, now)} {terms.period_s}"
    recorded = _text(period).split()[:2] if period is not None else []
    if balance is None or recorded != current.split():  # renewed by the next fast job
        return terms.fast_seconds if full is None else full
    return float(balance)


def account_json(key: ApiKey, clients: list[redis.Redis], now: float) -> dict[str, Any]:
    """The account of ``key`` as JSON: its plan, limits and fast time, the parts on each
    of ``clients`` (each cell's Redis; one Redis: one) summed (reads Redis)."""
    terms = plan(key.plan)
    renews_at = float((period_index(terms, now) + 1) * terms.period_s)
    part = share(terms.fast_seconds)  # what a period begins with in each cell
    left = sum(fast_seconds_left(client, key.account, terms, now, part) for client in clients)
    return {"account": key.account, "plan": terms.name,
            "fast_seconds_left": round(max(0.0, left), 3),
            "fast_renews_at": iso(renews_at), "fast_renews_at_unix": renews_at,
            "limits": {name: getattr(terms, name) for name in LIMIT_FIELDS}}


@router.get("/account")
def account(key: ApiKey = Depends(caller)) -> dict[str, Any]:
    """The caller's account: its plan and the plan's limits, its fast GPU seconds left
    and when they are renewed."""
    return account_json(key, [client for _, _, client in cells.each()], time.time())


def _text(value: str | bytes) -> str:
    return value.decode() if isinstance(value, bytes) else value
