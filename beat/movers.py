"""What beat moves between lanes, and when: queue-wait deadlines and relax aging.

The moves themselves are the broker's (``tasks.broker.moves``: one Lua step per
message, removed only if still there, its depths, due index, run rank
and fast place following it, fenced by beat's epoch). What is due is read from each
lane's due index (``tasks.broker.keys.due_key``), never by reading every list: a
round costs what it moves, whatever the number of workers.

- A downgradable job that waited past its lane's budget (counted from when
  it entered that lane) moves down a lane, marked ``waited_past_budget``: fresh
  jobs can still make their budget, and the stale one is served before that lane's
  own jobs. A fast job goes to the *front* of standard. A standard job goes to
  the first level of relaxed, which holds only jobs moved down or aged, at its
  *back*: behind those moved or aged before it, so it keeps its place in time
  (at the front, every round's moves went ahead of the earlier ones, and under a
  long overload the first moved waited longest). A standard job queued for a
  worker stays that worker's, in its own relaxed queue: the worker holds its model
  warm, and an idle worker holding it takes it from there (``beat.balance``); in
  the shared relaxed lane the first free worker took it, whatever it held, and
  paid a cold load (at 2x load on 1,000 simulated GPUs, 3,555 of 4,020). Jobs submitted with
  ``downgradable=False`` (fast jobs, by default) stay where they are.
- A job that leads a coalesced run (``tasks.jobs.cache``) takes its run down with
  it: the run's rank becomes the lower lane's in the same step, so no faster
  caller joins it there.
- In relaxed, heavy users' jobs sit in lower priority levels; one that waited
  the standard lane's budget (``fair_aging_s``) goes to the first level (at its
  back, in the order of age), ahead of every fresh job, so light users go first
  and no account waits much longer than the aging time.
"""
from __future__ import annotations

import logging
import time

import redis

from beat import fastsplit
from beat.balance import node_of
from routing.names import MOVERS_TASK, RELAXED, worker_queue
from routing.policy import WAITED_PAST_BUDGET, next_lane
from tasks.broker import leader
from tasks.broker.app import app, redis_client
from tasks.broker.keys import PRIORITY_SEP, lane_keys
from tasks.broker.moves import STOP, Queued, move_due
from tasks.jobs import admission
from tasks.jobs.accounts import renew_spent
from tasks.settings import settings

log = logging.getLogger(__name__)


def moved_to(source: str, lower: str) -> str:
    """The list a job that waited past its budget in list ``source`` moves to, in lane
    ``lower``: relaxed's first level of the same worker's own queue (it holds the job's
    model warm) or of the shared lane; standard's shared list."""
    node = node_of(source)
    if lower == RELAXED and node:
        return worker_queue(RELAXED, node)  # its first level: moved and aged jobs only
    return lane_keys(lower)[0]


def enforce_deadlines(client: redis.Redis, budgets_s: dict[str, float],
                      now: float | None = None) -> dict[str, int]:
    """Move jobs that waited past their lane's budget one lane down (``moved_to``: the
    front of standard, the back of relaxed's first level), from the shared lane and
    every worker's own queue of it: found from the lane's due index, whatever the
    number of workers."""
    now = time.time() if now is None else now
    moved = {}
    for lane, budget_s in budgets_s.items():
        lower = next_lane(lane)

        def due(queued: Queued, lower: str = lower, budget_s: float = budget_s) -> dict | None:
            if queued.waited_s(now) < budget_s:
                return STOP  # the index was ahead of the message: it stays indexed
            if not queued.message.job.downgradable:
                return None
            return queued.demoted(lower, WAITED_PAST_BUDGET, now)

        moved[lane] = move_due(client, lane, now - budget_s, due,
                               lambda key, lower=lower: moved_to(key, lower),
                               back=lower == RELAXED)
    return moved


def age_relaxed(client: redis.Redis, aging_s: float, now: float | None = None) -> int:
    """Lift relaxed jobs older than ``aging_s`` from any level to level 0 of their queue
    (the shared relaxed lane, or a worker's own), at its back (in the order of age),
    from the due index."""
    now = time.time() if now is None else now

    def due(queued: Queued) -> dict | None:
        return STOP if queued.waited_s(now) < aging_s else queued.first_in_level()

    return move_due(client, RELAXED, now - aging_s, due,
                    lambda key: key.partition(PRIORITY_SEP)[0], back=True)


@app.task(name=MOVERS_TASK)
def move_queued() -> str:
    """One round of deadline downgrades and relax aging, under a leader's epoch only."""
    if not leader.leading("the movers round"):
        return leader.NOT_LEADING
    client = redis_client()
    moved = enforce_deadlines(client, settings.max_wait_s)
    lifted = age_relaxed(client, settings.fair_aging_s)
    if any(moved.values()) or lifted:
        log.warning("moved past budget: %s; relaxed jobs lifted by age: %d", moved, lifted)
    let_in, renewed = admission.sweep(client), renew_spent(client, time.time())
    spread = fastsplit.spread_round(time.time()) if fastsplit.leads_the_cells() else 0
    return (f"deadline moves {moved}, aged {lifted}, parked let in {let_in}, renewed "
            f"{renewed}, fast seconds spread over the cells for {spread}")
