"""Idle workers take queued work: which queued jobs move to which idle worker (pure).

Placement puts most jobs in a worker's own queue, where only that worker takes them.
Whatever the placement, queues drain at different speeds (jobs differ in size, a
worker loads a model), and at the end of a backlog, or under a steady load, some
workers run dry while others still hold a queue. Each heartbeat, beat gives each idle
worker (alive, nothing running, loading or queued) jobs of a model it holds warm from
the queues that wait longest: the youngest of them, which would wait longest where
they are. A job moves to an idle worker without its model only when it would wait
there longer than ``COLD_FACTOR`` times that model's load (delay scheduling: a cold
load costs more than a short wait).

A fast job starts at once where it is placed, or at the running job's next step; one
that still waits in a worker's own queue a heartbeat later is stuck: behind a fast run
or a load, which nothing preempts, or a run that may no longer step aside, placed from
a snapshot that did not show them yet. Beat moves it to a worker that holds its model
warm and has no fast work, the least busy first (``rescue_fast``).
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Iterable, Mapping

from routing.compact import fast_work
from routing.names import FAST, lane_of
from routing.placement import serving

#: A job moves to an idle worker that must load its model only when it would wait
#: this many times the load where it is.
COLD_FACTOR = 2.0
#: Jobs an idle worker gets in one round at most (what it runs before the next round,
#: when its jobs are short).
MOST_PER_WORKER = 8


@dataclass(frozen=True)
class Queued:
    """A job waiting in a worker's own queue: its list, its model, what it is there
    (``ref``: the caller's handle, e.g. the raw message), and how long it would still
    wait there (``wait_s``). ``rank``: its lane's (0: fast) and step's order: lower
    ranks move first."""

    key: str
    model: str
    wait_s: float
    rank: tuple[int, int]
    ref: Any = None


def heard(worker: Mapping[str, Any]) -> bool:
    """Serving, and heard this round: a worker that missed a heartbeat (frozen, cut off)
    is alive until it misses ``beat.health.MISSES_ALLOWED`` of them, on stats that may
    be stale."""
    return serving(worker) and not worker.get("missed")


def idle(workers: Mapping[str, Mapping[str, Any]]) -> list[str]:
    """Workers heard this round that have nothing to do: no job running, no model
    loading, no job in their own queues (``queued``, as beat counts it from the lists)."""
    return sorted(host for host, w in workers.items() if heard(w)
                  and not any(w.get("in_flight", {}).values())
                  and not w.get("loading_models") and not w.get("queued"))


def backlog_s(worker: Mapping[str, Any], drain_s: float) -> float:
    """Seconds a job put at the back of ``worker``'s own queues waits: what is queued
    there, and the job it runs, at ``drain_s`` a job."""
    return (worker.get("queued", 0) + sum(worker.get("in_flight", {}).values())) * drain_s


def per_worker(heartbeat_s: float, drain_s: float | None) -> int:
    """Jobs to give an idle worker per round: those it runs in one heartbeat."""
    if not drain_s:
        return 1
    return max(1, min(MOST_PER_WORKER, math.ceil(heartbeat_s / drain_s)))


def hand_out(idle_warm: Mapping[str, Iterable[str]], queued: Iterable[Queued],
             cold_s: Mapping[str, float], cold_default_s: float,
             per_host: int = 1, min_wait_s: float = 0.0) -> list[tuple[Queued, str]]:
    """(job, idle worker) moves: each idle worker (``idle_warm``: its warm models) gets
    up to ``per_host`` jobs of the models it holds, the lowest rank first, then the
    longest wait; then each that got none, a job that would wait longer than
    ``COLD_FACTOR`` loads of its model (``cold_s``, else ``cold_default_s``; none when
    no load was ever measured), so no worker takes a job cold that another idle one
    holds warm. Only jobs that would wait longer than ``min_wait_s`` where they are
    move (beat passes a heartbeat: what it decides from is up to that old, and a job
    that waits less may have started, or its worker may be idle no more, by the time
    it moves), each once; a worker's jobs come oldest first (least left to wait), the
    order they should run in."""
    ordered = sorted((q for q in queued if q.wait_s > min_wait_s),
                     key=lambda q: (q.rank, -q.wait_s))
    by_model: dict[str, list[Queued]] = {}
    for job in ordered:
        by_model.setdefault(job.model, []).append(job)
    moves: list[tuple[Queued, str]] = []
    taken: set[int] = set()
    # each list is read from the first job not taken yet: what lies before is taken
    starts: dict[str, int] = {}
    for host, warm in idle_warm.items():
        for _ in range(per_host):
            job = _first_warm(warm, by_model, taken, starts)
            if job is None:
                break
            taken.add(id(job))
            moves.append((job, host))
    given = {host for _, host in moves}
    cold = iter([q for q in ordered
                 if q.wait_s > COLD_FACTOR * _load_s(cold_s, cold_default_s, q.model)])
    for host in idle_warm:
        job = None if host in given else next((q for q in cold if id(q) not in taken), None)
        if job is None and host not in given:
            break  # none left for a cold load: nor for the workers after it
        if job is not None:
            taken.add(id(job))
            moves.append((job, host))
    return sorted(moves, key=lambda move: (move[1], move[0].wait_s))


def _load_s(cold_s: Mapping[str, float], default_s: float, model: str) -> float:
    """What loading ``model`` costs; never measured (0): too much to risk."""
    return cold_s.get(model, default_s) or math.inf


def _first_warm(warm: Iterable[str], by_model: Mapping[str, list[Queued]],
                taken: set[int], starts: dict[str, int]) -> Queued | None:
    best = None
    for model in warm:
        jobs, at = by_model.get(model, ()), starts.get(model, 0)
        while at < len(jobs) and id(jobs[at]) in taken:
            at += 1
        starts[model] = at
        job = jobs[at] if at < len(jobs) else None
        if job is not None and (best is None or (job.rank, -job.wait_s) <
                                (best.rank, -best.wait_s)):
            best = job
    return best


def rescue_fast(workers: Mapping[str, Mapping[str, Any]],
                stuck: Iterable[Queued]) -> list[tuple[Queued, str]]:
    """(fast job, worker) moves for fast jobs stuck in a worker's own queue: each to
    another worker holding its model warm with no fast work (``routing.compact.
    fast_work``), the least busy first; one to a worker, the longest waiting first."""
    free: dict[str, list[tuple[int, str]]] = {}
    for host, w in workers.items():
        if heard(w) and not fast_work(w):
            busy = sum(w.get("in_flight", {}).values()) + w.get("queued", 0)
            for model in w.get("warm_models", ()):
                free.setdefault(model, []).append((busy, host))
    for hosts in free.values():
        hosts.sort()
    moves: list[tuple[Queued, str]] = []
    used: set[str] = set()
    for job in sorted(stuck, key=lambda q: -q.wait_s):
        source = job.key.partition(".")[2]
        host = next((h for _, h in free.get(job.model, ()) if h not in used and h != source),
                    None)
        if host is not None and lane_of(job.key) == FAST:
            used.add(host)
            moves.append((job, host))
    return moves
