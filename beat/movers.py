"""What beat moves between lanes, and when: queue-wait deadlines and relax aging.

The moves themselves are the broker's (``tasks.broker.moves``: one Lua step per
message, removed only if still there, its ledger entry, run rank and fast place
following it).

- A downgradable job that waited past its lane's budget (counted from when
  it entered that lane) moves to the *front* of the lane below, marked
  ``waited_past_budget``: fresh jobs can still make their budget, and the
  stale one is served before that lane's own jobs. Jobs submitted with
  ``downgradable=False`` (fast jobs, by default) stay where they are.
- A job that leads a coalesced run (``tasks.jobs.cache``) takes its run down with
  it: the run's rank becomes the lower lane's in the same step, so no faster
  caller joins it there.
- In relaxed, heavy users' jobs sit in lower priority levels; one that
  waited ``GPULANES_FAIR_AGING_S`` goes to the front of the first level, so
  light users go first and no account waits much longer than the aging time.
"""
from __future__ import annotations

import logging
import time
from typing import Iterable

import redis

from beat.ledger import recover_lost
from routing.names import FAST, MOVERS_TASK, RELAXED, worker_queue
from routing.policy import WAITED_PAST_BUDGET, next_lane
from tasks.broker.app import app, redis_client
from tasks.broker.keys import WORKERS_KEY, lane_keys
from tasks.broker.moves import STOP, Queued, move_oldest
from tasks.settings import settings

log = logging.getLogger(__name__)


def _not_yet(queued: Queued) -> dict | None:
    """A message that is not due: STOP in arrival order; skip one moved in out of
    order (it sits at the front with its own clock) so it blocks nobody."""
    return None if queued.moved_in() else STOP


def enforce_deadlines(client: redis.Redis, budgets_s: dict[str, float],
                      now: float | None = None, nodes: Iterable[str] = ()) -> dict[str, int]:
    """Move jobs that waited past their lane's budget one lane down (to the shared
    lane below), from the shared lane and from each of ``nodes``' own queues."""
    now = time.time() if now is None else now
    nodes = list(nodes)
    moved = {}
    for lane, budget_s in budgets_s.items():
        lower = next_lane(lane)

        def due(queued: Queued, lower=lower, budget_s=budget_s) -> dict | None:
            if queued.waited_s(now) < budget_s:
                return _not_yet(queued)
            if not queued.message.job.downgradable:
                return None
            return queued.demoted(lower, WAITED_PAST_BUDGET, now)

        sources = [lane] + [worker_queue(lane, node) for node in nodes]
        moved[lane] = sum(move_oldest(client, lane_keys(source)[0], lane_keys(lower)[0], due,
                                       leaves_fast=lane == FAST)
                          for source in sources)
    return moved


def age_relaxed(client: redis.Redis, aging_s: float, now: float | None = None,
                nodes: Iterable[str] = ()) -> int:
    """Lift relaxed jobs older than ``aging_s`` from any level to the front of level
    0, in the shared relaxed lane and in each of ``nodes``' own relaxed queue."""
    now = time.time() if now is None else now
    moved = 0

    def due(queued: Queued) -> dict | None:
        if queued.waited_s(now) < aging_s:
            return _not_yet(queued)
        return queued.first_in_level()

    for queue in [RELAXED] + [worker_queue(RELAXED, node) for node in nodes]:
        keys = lane_keys(queue)
        moved += sum(move_oldest(client, key, keys[0], due) for key in keys[1:])
    return moved


@app.task(name=MOVERS_TASK)
def move_queued() -> str:
    """One round of deadline downgrades and relax aging."""
    client = redis_client()
    nodes = client.hkeys(WORKERS_KEY)  # every worker with its own queues
    moved = enforce_deadlines(client, settings.max_wait_s, nodes=nodes)
    lifted = age_relaxed(client, settings.fair_aging_s, nodes=nodes)
    if any(moved.values()) or lifted:
        log.warning("moved past budget: %s; relaxed jobs lifted by age: %d", moved, lifted)
    recovered = recover_lost(client, grace_s=max(10.0, 3 * settings.heartbeat_s))
    return f"deadline moves {moved}, aged {lifted}, lost and put back {recovered}"
