"""What a lane's queued jobs are made of, from a bounded sample of its lists.

Jobs differ in size (a 1024 px 50-step image is not a 256 px 20-step one): each
message carries its model's ``cost(inputs)`` (``tasks.broker.message.Job.cost``)
and each worker reports, per model, its service time as a line in the cost
(``cost_ms``: ``gpu_worker.costfit``). Each round beat reads up to ``SAMPLE_PER_LANE`` messages of each
lane, the next to run first, spread over its longest lists, and
``beat.snapshot.lane_loads`` prices them. The read is bounded per lane, whatever
the depth or the number of workers' own queues.
"""
from __future__ import annotations

from typing import Mapping

import redis

from beat.snapshot import Queued
from tasks.broker import envelope
from tasks.broker.message import Job
from tasks.broker.moves import next_to_run

#: Messages read per lane and round to price its queued jobs.
SAMPLE_PER_LANE = 48


def sample_plan(lengths: Mapping[str, int], budget: int = SAMPLE_PER_LANE) -> dict[str, int]:
    """How many messages to read from each list of one lane: the budget spread over
    the non-empty lists, longest first (pure)."""
    plan: dict[str, int] = {}
    filled = sorted((key for key, n in lengths.items() if n), key=lambda k: -lengths[k])
    for left, key in zip(range(len(filled), 0, -1), filled):
        take = min(lengths[key], -(-budget // left))
        if take <= 0:
            break
        plan[key], budget = take, budget - take
    return plan


def queued_sample(client: redis.Redis,
                  lengths: Mapping[str, Mapping[str, int]]) -> dict[str, list[Queued]]:
    """(model, cost) of a sample of each lane's queued jobs, the next to run of each
    list; ``lengths``: per lane, each of its lists' length."""
    plans = {lane: sample_plan(per_list) for lane, per_list in lengths.items()}
    with client.pipeline(transaction=False) as pipe:
        for plan in plans.values():
            for key, n in plan.items():
                next_to_run(pipe, key, n)
        read = iter(pipe.execute())
    return {lane: [_priced(raw) for key in plan for raw in next(read)]
            for lane, plan in plans.items()}


def _priced(raw: bytes | str) -> Queued:
    try:
        return Job.model_and_cost(envelope.call(envelope.decode(raw))[1])
    except (ValueError, KeyError, TypeError, IndexError):  # not a job message: average
        return "", 1.0
