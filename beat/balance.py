"""Each heartbeat, fast jobs stuck in a worker's own queue move to a holder of their
model with no fast work, and idle workers take queued jobs of the models they hold warm
from the own queues that wait longest (``routing.balance`` chooses; ``tasks.broker.
moves.hand_over`` moves, a message at a time, only if it is still queued).

What it reads is bounded: the own fast queues that hold jobs (fast jobs start at once:
there are few), and, while a worker is idle, the youngest ``READ_PER_LIST`` messages
(or as many as an idle worker gets in a round) of the ``lists_to_read`` longest-waiting
own queues; one pipelined read, whatever the number of workers.
"""
from __future__ import annotations

import heapq
import logging
import time
from typing import Any, Callable, Iterable, Mapping

import redis

from routing.balance import Queued, backlog_s, hand_out, idle, per_worker, rescue_fast
from routing.compact import cold_s_of, drain_s_of, warm_of
from routing.names import FAST, LANES, lane_of, worker_queue
from routing.placement import serving
from tasks.broker import envelope
from tasks.broker.keys import PRIORITY_SEP
from tasks.broker.message import JobMessage
from tasks.broker.moves import UNREADABLE, hand_over

log = logging.getLogger(__name__)
#: Messages read from the young end of each list weighed.
READ_PER_LIST = 4
#: Own queues weighed per idle worker, and at most in all.
LISTS_PER_IDLE, LISTS_MOST = 4, 256


def lists_to_read(idle_count: int) -> int:
    """How many of the longest-waiting own queues to read for ``idle_count`` idle workers."""
    return min(LISTS_MOST, max(32, LISTS_PER_IDLE * idle_count))


def node_of(key: str) -> str:
    """The worker whose own list ``key`` is ("" for a shared lane's)."""
    return key.partition(PRIORITY_SEP)[0].partition(".")[2]


def step_of(key: str) -> int:
    """The kombu priority step of list ``key`` (0: the list named as its queue)."""
    step = key.partition(PRIORITY_SEP)[2]
    return int(step) if step else 0


def target_key(key: str, host: str) -> str:
    """``host``'s own list of the same lane and step as list ``key``."""
    queue, sep, step = key.partition(PRIORITY_SEP)
    return worker_queue(lane_of(queue), host) + sep + step


#: What ``choose`` reads: the youngest ``count`` messages of each list of ``keys``, each as
#: (model, when it entered its lane, the message).
Read = Callable[[list[str], int], list[list[tuple[str, float, Any]]]]


def choose(workers: Mapping[str, Mapping[str, Any]], keys: Iterable[str], read: Read,
           now: float, heartbeat_s: float, default_drain_s: float,
           idle_hosts: list[str] | None = None) -> list[tuple[Queued, str]]:
    """The (job, worker) moves of a round: fast jobs stuck in a worker's own queue a
    heartbeat or more to a holder with no fast work (``rescue_fast``), then jobs to idle
    workers (``hand_out``). ``workers``: the record with beat's ``queued`` counts;
    ``keys``: the lists holding jobs; ``read``: the youngest ``READ_PER_LIST`` messages
    of some of them. A job's wait where it is: its worker's backlog less the jobs
    behind it (the youngest of a list waits for all the rest; an approximation, as
    the worker's other lists may run first or after). ``idle_hosts``: the idle
    workers, in order, as beat keeps them (else found here)."""
    idle_hosts = idle(workers) if idle_hosts is None else idle_hosts
    idle_set = set(idle_hosts)
    owners = {key: node for key in keys if (node := node_of(key)) in workers}
    # only the workers with queued jobs or idle are weighed: their drain, and its pace
    weighed = idle_set.union(owners.values())
    drains = {host: drain_s_of(workers[host]) for host in weighed}
    # a worker that has measured no job yet goes at the pace the others measured; while
    # none has, how long a queue waits is not known and nothing moves to idle workers
    measured = sorted(drain for drain in drains.values() if drain)
    pace_s = measured[len(measured) // 2] if measured else None
    drains = {host: drain or pace_s for host, drain in drains.items()}
    busy_hosts = {host for host in weighed - idle_set if serving(workers[host])}
    waits = {host: backlog_s(workers[host], drains[host]) for host in busy_hosts
             if drains[host]}
    busy = [(waits.get(node, 0.0), key) for key, node in owners.items() if node in busy_hosts]
    # a stuck fast job's wait is its own (it waited a heartbeat): any busy worker's
    fast = [key for _, key in heapq.nlargest(
        LISTS_MOST, (item for item in busy if lane_of(item[1]) == FAST))]
    own = [(wait_s, key) for wait_s, key in busy if owners[key] in waits]
    longest = heapq.nlargest(lists_to_read(len(idle_hosts)), own) if idle_hosts else []
    to_read = list(dict.fromkeys([*fast, *(key for _, key in longest)]))
    if not to_read:
        return []
    idle_drains = sorted(drains[host] or default_drain_s for host in idle_hosts) or [0.0]
    per_host = per_worker(heartbeat_s, idle_drains[len(idle_drains) // 2])
    found = dict(zip(to_read, read(to_read, max(READ_PER_LIST, per_host))))
    stuck = [Queued(key, model, now - clock, (0, 0), ref) for key in fast
             for model, clock, ref in found[key] if model and now - clock >= heartbeat_s]
    moves = rescue_fast(workers, stuck) if stuck else []
    if not idle_hosts:
        return moves
    rescued, used = {id(job.ref) for job, _ in moves}, {host for _, host in moves}
    queued = [Queued(key, model, wait_s - (young + 1) * drains[node_of(key)],
                     (LANES.index(lane_of(key)), step_of(key)), ref)
              for wait_s, key in longest
              for young, (model, _, ref) in enumerate(found[key])
              if model and id(ref) not in rescued]
    cold = cold_s_of([workers[host] for host in weighed])
    return moves + hand_out(
        takers(workers, [host for host in idle_hosts if host not in used], queued),
        queued, cold, sum(cold.values()) / len(cold) if cold else 0.0, per_host, heartbeat_s)


def takers(workers: Mapping[str, Mapping[str, Any]], idle_hosts: list[str],
           queued: list[Queued]) -> dict[str, tuple[str, ...]]:
    """The idle workers worth weighing for ``queued`` jobs, in order, with their warm
    models: every one holding a queued job's model, and as many others as there are
    jobs (each takes one cold at most): a round costs what it can move, not the
    number of idle workers."""
    wanted = {job.model for job in queued}
    warm = {host: warm_of(workers[host]) for host in idle_hosts}
    others = iter(range(len(queued)))
    return {host: models for host, models in warm.items()
            if not wanted.isdisjoint(models) or next(others, None) is not None}


def give_idle_work(client: redis.Redis, workers: Mapping[str, Mapping[str, Any]],
                   lengths: Mapping[str, Mapping[str, int]], heartbeat_s: float,
                   default_drain_s: float, now: float | None = None,
                   idle_hosts: list[str] | None = None) -> int:
    """Move stuck fast jobs and queued jobs for idle workers (``lengths``: per lane,
    each list's length; ``idle_hosts``: the idle workers, in order, else found here);
    how many moved. With no idle worker only the fast lists are weighed."""
    def read(keys: list[str], count: int) -> list[list[tuple[str, float, Any]]]:
        with client.pipeline(transaction=False) as pipe:
            for key in keys:
                pipe.lrange(key, 0, count - 1)  # kombu pushes on the left: the young end
            return [[(*_model_and_clock(raw), raw) for raw in raws] for raws in pipe.execute()]

    idle_hosts = idle(workers) if idle_hosts is None else idle_hosts
    weighed = lengths.values() if idle_hosts else [lengths.get(FAST, {})]
    moves = choose(workers, (key for per_list in weighed for key in per_list), read,
                   time.time() if now is None else now, heartbeat_s, default_drain_s,
                   idle_hosts)
    moved = hand_over(client, [(job.key, target_key(job.key, host), job.ref)
                               for job, host in moves]) if moves else 0
    if moved:
        log.info("%d queued job(s) to %d other worker(s)", moved,
                 len({host for _, host in moves}))
    return moved


def _model_and_clock(raw: bytes | str) -> tuple[str, float]:
    try:
        message = JobMessage.decode(envelope.call(envelope.decode(raw))[1])
        return message.job.model, message.lane_clock
    except UNREADABLE:
        return "", 0.0  # not a job message: it stays where it is
