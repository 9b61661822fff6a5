"""An account's fast seconds across cells (``tasks.settings_cells``).

Each cell admits an account's fast jobs against its own part of the account's fast
seconds, in the publish's one step, and charges its runs to that part, as one Redis does
(``lua/publish.lua``, ``lua/run_finish.lua``). The parts sum to what the account has
left: a new account starts with an equal part in each (``tasks.broker.cell.share``).

Each round, the beat leading the first cell takes the accounts that some cell found
spent (its exhausted set) and spreads what their parts sum to over the cells, by the
account's GPU time in each over the last :data:`USAGE_BUCKETS` minutes: the cell where
it spends gets the seconds it holds elsewhere. Each part moves by a difference
(``lua/fast_add.lua``), so charges made meanwhile hold, and the parts taken away move
first: a cell lost between the two steps costs the account seconds, never gives it more.

So an account overshoots its fast seconds by what each cell admitted before its part
ran out (at most its fast jobs queued or running there, as with one Redis: one job per
cell beyond what one Redis lets run), and its fast jobs in a cell whose part ran out
run in relaxed until the next round gives it more. Accounts on a plan renew each
period in each cell, and are left alone here.
"""
from __future__ import annotations

import logging
from functools import lru_cache
from typing import Mapping

import redis
from kombu.utils.encoding import bytes_to_str

from tasks.broker import scripts
from tasks.broker.cell import share
from tasks.broker.keys import (
    FAST_BALANCE_KEY,
    FAST_EXHAUSTED_KEY,
    FAST_PERIOD_KEY,
    USAGE_BUCKET_S,
    usage_key,
)
from tasks.broker.outage import OUTAGE
from tasks.broker.store import connect
from tasks.settings import settings

log = logging.getLogger(__name__)
#: Spent accounts spread per round at most.
SPREAD_BATCH = 100
#: Minutes of GPU time that weigh each cell's part.
USAGE_BUCKETS = 3
#: Weight of a cell where the account used no GPU time lately (all such: equal parts).
UNUSED = 1e-3


def leads_the_cells() -> bool:
    """Whether this beat's cell is the first of several (its leader spreads)."""
    return bool(settings.cells) and next(iter(settings.cells.values())) == settings.broker_url


#: Longest wait for a cell's answer: a frozen cell holds the first cell's movers round
#: up at most this long.
CELL_TIMEOUT_S = 0.5


@lru_cache(maxsize=None)
def cell_client(url: str) -> redis.Redis:
    """A client of a cell's Redis."""
    return connect(url, settings.sentinel_master,
                   timeout_s=min(CELL_TIMEOUT_S, settings.redis_timeout_s))


def spread_round(now: float) -> int:
    """:func:`spread` over every cell; 0 while one of them does not answer."""
    try:
        return spread({name: cell_client(url) for name, url in settings.cells.items()}, now)
    except OUTAGE as exc:
        log.warning("fast seconds not spread over the cells this round: %s", exc)
        return 0


def spread(clients: Mapping[str, redis.Redis], now: float) -> int:
    """Spread the parts of up to :data:`SPREAD_BATCH` accounts spent in some cell;
    how many accounts' parts moved."""
    accounts: set[str] = set()
    for client in clients.values():
        accounts.update(bytes_to_str(a) for a in client.srandmember(FAST_EXHAUSTED_KEY, SPREAD_BATCH))
    accounts_read = sorted(accounts)[:SPREAD_BATCH]
    if not accounts_read:
        return 0
    found = {name: _read(client, accounts_read, now) for name, client in clients.items()}
    moves: list[tuple[str, str, float]] = []
    for i, account in enumerate(accounts_read):
        parts = {name: read[0][i] for name, read in found.items()}
        if any(read[1][i] for read in found.values()):
            continue  # on a plan: renewed per period, in each cell
        targets = parts_by_use(parts, {name: read[2][i] for name, read in found.items()})
        moves += [(name, account, targets[name] - part) for name, part in parts.items()
                  if abs(targets[name] - part) > 1e-9]
    start = repr(share(settings.fast_seconds_default))
    for name, account, delta in sorted(moves, key=lambda move: move[2] > 0):  # takes first
        scripts.run(clients[name], "fast_add", [FAST_BALANCE_KEY, FAST_EXHAUSTED_KEY],
                    [account, repr(delta), start])
    return len({account for _, account, _ in moves})


def parts_by_use(parts: Mapping[str, float], used: Mapping[str, float]) -> dict[str, float]:
    """What each cell's part becomes: the parts' sum, shared by each cell's use (all
    unused: equal parts). Unchanged while no part is above zero and the sum is not
    either (spent everywhere: nothing to move)."""
    total = sum(parts.values())
    if total <= 0 and all(part <= 0 for part in parts.values()):
        return dict(parts)
    weights = {name: used.get(name, 0.0) + UNUSED for name in parts}
    whole = sum(weights.values())
    return {name: total * weight / whole for name, weight in weights.items()}


def _read(client: redis.Redis, accounts: list[str], now: float
          ) -> tuple[list[float], list[bool], list[float]]:
    """Of ``accounts`` in one cell: their parts, whether each is on a plan, and the GPU
    seconds each used there over the last :data:`USAGE_BUCKETS` buckets."""
    newest = int(now) // USAGE_BUCKET_S
    with client.pipeline(transaction=False) as pipe:
        pipe.hmget(FAST_BALANCE_KEY, accounts)
        pipe.hmget(FAST_PERIOD_KEY, accounts)
        for bucket in range(newest - USAGE_BUCKETS + 1, newest + 1):
            pipe.hmget(usage_key(bucket), accounts)
        balances, periods, *buckets = pipe.execute()
    start = share(settings.fast_seconds_default)
    return ([start if left is None else float(left) for left in balances],
            [period is not None for period in periods],
            [sum(float(b[i] or 0) for b in buckets) for i in range(len(accounts))])
