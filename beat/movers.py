"""Moving queued jobs between Redis lists: queue-wait deadlines and relax aging.

Both read the oldest messages of a list (kombu pops from the right) and move
each with one Lua script that removes it only if it is still there, so a
worker taking it at the same moment is never double-served and nothing is
dropped.

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

import base64
import binascii
import json
import logging
import time
from typing import Callable, Iterable

import redis

from beat.ledger import recover_lost
from routing.names import FAST, LANES, MOVERS_TASK, RELAXED, worker_queue
from routing.policy import WAITED_PAST_BUDGET, next_lane
from tasks.broker import scripts
from tasks.broker.app import app, redis_client
from tasks.broker.keys import (
    LEDGER_KEY,
    WORKERS_KEY,
    fast_queued_key,
    lane_keys,
    lane_of_key,
    lists_key,
    run_key,
)
from tasks.settings import settings

log = logging.getLogger(__name__)

#: Returned by a ``due`` function: this message and all younger ones stay.
STOP: dict = {}
#: Oldest messages looked at per list per round: a round must stay short.
MOVES_PER_ROUND = 200


def _body(message: dict) -> list:
    return json.loads(base64.b64decode(message["body"]))


def _with_body(message: dict, body: list) -> dict:
    return {**message, "body": base64.b64encode(json.dumps(body).encode()).decode()}


def demote(message: dict, lane: str, reason: str, now: float) -> dict:
    """The same message, addressed to ``lane``, its route saying why and when it moved."""
    args, kwargs, embed = _body(message)
    route = kwargs["route"]
    kwargs["route"] = {**route, "lane": lane, "downgraded_from": route["requested_tier"],
                       "downgrade_reason": reason, "lane_since": now}
    properties = {**message["properties"],
                  "delivery_info": {"exchange": lane, "routing_key": lane}}
    return {**_with_body(message, [args, kwargs, embed]), "properties": properties}


def _move_oldest(client: redis.Redis, source: str, target: str,
                 due: Callable[[dict], dict | None], leaves_fast: bool = False) -> int:
    """Move each of the oldest messages of ``source`` that ``due`` rewrites.

    ``due`` returns the rewritten message, None to leave it, or ``STOP`` when
    it and everything younger are not due yet. Moved messages keep their
    order at the front of ``target``: the oldest is served first.
    ``leaves_fast``: a moved job gives back its account's fast place.
    """
    batch, lane = [], lane_of_key(target)
    for raw in reversed(client.lrange(source, -MOVES_PER_ROUND, -1)):  # oldest first
        try:
            message = json.loads(raw)
            rewritten = due(message)
            account = _body(message)[1]["job"].get("account") if leaves_fast else None
            ids = [message["headers"]["id"], message["properties"]["delivery_tag"]]
        except (ValueError, KeyError, TypeError, IndexError, binascii.Error):
            continue  # not a job message: a worker refuses and dead-letters it
        if rewritten is STOP:
            break
        if rewritten is not None:
            places = [fast_queued_key(account)] if account else []
            batch.append(([source, target, LEDGER_KEY, lists_key(lane), run_key(ids[0]),
                           *places], [raw, json.dumps(rewritten), *ids, LANES.index(lane)]))
    return sum(scripts.run(client, "move", keys, args) for keys, args in reversed(batch))


def readdress(client: redis.Redis, source: str, target: str, lane: str) -> int:
    """Move the oldest messages of ``source`` (every one, up to a round's worth) to
    the front of ``target``, addressed to ``lane``; their route is unchanged."""
    def due(message: dict) -> dict:
        delivery_info = {"exchange": lane, "routing_key": lane}
        return {**message, "properties": {**message["properties"],
                                          "delivery_info": delivery_info}}

    return _move_oldest(client, source, target, due)


def _not_yet(message: dict) -> dict | None:
    """A message that is not due: STOP in arrival order; skip one moved in out of
    order (it sits at the front with its own clock) so it blocks nobody."""
    return None if "lane_since" in _body(message)[1]["route"] else STOP


def _waited_s(message: dict, now: float) -> float:
    kwargs = _body(message)[1]
    return now - kwargs["route"].get("lane_since", kwargs["submitted_at"])


def enforce_deadlines(client: redis.Redis, budgets_s: dict[str, float],
                      now: float | None = None, nodes: Iterable[str] = ()) -> dict[str, int]:
    """Move jobs that waited past their lane's budget one lane down (to the shared
    lane below), from the shared lane and from each of ``nodes``' own queues."""
    now = time.time() if now is None else now
    nodes = list(nodes)
    moved = {}
    for lane, budget_s in budgets_s.items():
        lower = next_lane(lane)

        def due(message: dict, lower=lower, budget_s=budget_s) -> dict | None:
            if _waited_s(message, now) < budget_s:
                return _not_yet(message)
            if not _body(message)[1]["job"].get("downgradable", True):
                return None
            return demote(message, lower, WAITED_PAST_BUDGET, now)

        sources = [lane] + [worker_queue(lane, node) for node in nodes]
        moved[lane] = sum(_move_oldest(client, lane_keys(source)[0], lane_keys(lower)[0], due,
                                       leaves_fast=lane == FAST)
                          for source in sources)
    return moved


def age_relaxed(client: redis.Redis, aging_s: float, now: float | None = None,
                nodes: Iterable[str] = ()) -> int:
    """Lift relaxed jobs older than ``aging_s`` from any level to the front of level
    0, in the shared relaxed lane and in each of ``nodes``' own relaxed queue."""
    now = time.time() if now is None else now
    moved = 0

    def due(message: dict) -> dict | None:
        if _waited_s(message, now) < aging_s:
            return _not_yet(message)
        return {**message, "properties": {**message["properties"], "priority": 0}}

    for queue in [RELAXED] + [worker_queue(RELAXED, node) for node in nodes]:
        keys = lane_keys(queue)
        moved += sum(_move_oldest(client, key, keys[0], due) for key in keys[1:])
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
