"""What a lane's queued jobs are made of, from a bounded sample of its lists.

Jobs differ in size (a 1024 px 50-step image is not a 256 px 20-step one): each
message carries its model's ``cost(inputs)`` (``tasks.broker.message.Job.cost``)
and each worker reports, per model, its service time as a line in the cost
(``cost_ms``: ``gpu_worker.costfit``). Each round beat reads up to
``SAMPLE_PER_LANE`` messages of each lane, the next to run first, spread over its longest lists, and
``beat.snapshot.lane_loads`` prices them. The read is bounded per lane, whatever
the depth or the number of workers' own queues.
"""
from __future__ import annotations

from typing import Mapping

import redis

from beat.snapshot import QueuedJob
from tasks.broker import envelope
from tasks.broker.message import Job
from tasks.broker.moves import next_to_run

#: Messages read per lane and round to price its queued jobs.
SAMPLE_PER_LANE = 48


def sample_plan(lengths: Mapping[str, int], budget: int = SAMPLE_PER_LANE) -> dict[str, int]:
    """How many messages to read from each list of one lane: the budget shared fairly
    among the non-empty lists, the shortest served first so that what they leave goes
    to the longer ones; with more lists than the budget, the longest (pure)."""
    filled = sorted((key for key, n in lengths.items() if n), key=lambda k: lengths[k])
    filled = filled[-budget:]
    plan: dict[str, int] = {}
    for left, key in zip(range(len(filled), 0, -1), filled):
        plan[key] = min(lengths[key], budget // left)
        budget -= plan[key]
    return plan


def queued_sample(client: redis.Redis,
                  lengths: Mapping[str, Mapping[str, int]]) -> dict[str, list[QueuedJob]]:
    """(model, cost, weight) of a sample of each lane's queued jobs, the next to run of
    each list; ``lengths``: per lane, each of its lists' length. A sampled job weighs
    as many jobs of its list as it stands for, so a long list counts as long."""
    plans = {lane: sample_plan(per_list) for lane, per_list in lengths.items()}
    with client.pipeline(transaction=False) as pipe:
        for plan in plans.values():
            for key, n in plan.items():
                next_to_run(pipe, key, n)
        read = iter(pipe.execute())
    return {lane: [(*_priced(raw), lengths[lane][key] / n) for key, n in plan.items()
                   for raw in next(read)] for lane, plan in plans.items()}


def _priced(raw: bytes | str) -> tuple[str, float]:
    try:
        return Job.model_and_cost(envelope.call(envelope.decode(raw))[1])
    except Exception:  # noqa: BLE001  anything that is not a job message: an unknown job
        return "", 1.0
