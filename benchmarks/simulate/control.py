"""Beat's rounds on the virtual clock, through beat's own pure functions.

Called as ``beat.heartbeat.heartbeat`` calls them: ``merge`` (the worker record, misses
and deaths), ``lane_depths`` (per-worker queued counts, from the list lengths),
``beat.costs.sample_plan`` (which queued jobs price each lane), ``lane_loads`` (expected
waits), ``next_policy`` (hysteresis), ``relax_levels``, ``routing.compact.split`` (the
two parts routers read), ``beat.health.dead_incarnations``, ``beat.balance.choose``
(stuck fast jobs and idle workers' share of queued jobs). What has no pure function
underneath its Redis calls is done here, the decision each makes kept as the real code
states it: reading the pushed stats (``tasks.broker.stats.fresh_stats``: stats pushed
within a heartbeat and the reply time), putting a dead worker's held jobs back
(``tasks.broker.handover.put_back_all``: once its lease lapsed), handing a dead worker's own queues back
(``beat.shared``), and both movers (``beat.movers``: the ``due`` closures inside
``enforce_deadlines`` and ``age_relaxed``).
"""
from __future__ import annotations

import json
from typing import Any, Callable, Iterable, Mapping

from beat.balance import choose, node_of, target_key
from beat.costs import sample_plan
from beat.health import dead_incarnations
from beat.heartbeat import lane_depths
from beat.record import merge
from beat.movers import moved_to
from beat.snapshot import lane_loads, next_policy
from routing.compact import split
from routing.names import LANES, RELAXED, worker_queue
from routing.placement import serving
from routing.policy import WAITED_PAST_BUDGET, admission_waits, next_lane, relax_levels
from tasks.broker.keys import PRIORITY_SEP, USAGE_BUCKET_S, lane_keys
from tasks.broker.moves import MOVES_PER_ROUND

from benchmarks.simulate.cluster import Cluster
from benchmarks.simulate.config import SimConfig
from benchmarks.simulate.engine import Clock
from benchmarks.simulate.queues import SimJob

#: Members documents kept (a router reads the newest; a few older ones for a slow one).
MEMBERS_KEPT = 8


class Store:
    """What beat writes and routers read: the compact snapshot and members documents."""

    def __init__(self) -> None:
        self.compact: str | None = None
        self.members: dict[str, str] = {}

    def write(self, snapshot: dict) -> None:
        compact, members = split(snapshot)
        self.compact = json.dumps(compact, separators=(",", ":"))
        self.members[members["version"]] = json.dumps(members, separators=(",", ":"))
        while len(self.members) > MEMBERS_KEPT:
            del self.members[next(iter(self.members))]


class Accounts:
    """GPU seconds per account in usage buckets, and fast seconds left."""

    def __init__(self, config: SimConfig) -> None:
        self.config = config
        self.buckets: dict[int, dict[str, float]] = {}
        self.fast_left: dict[str, float] = {}
        self.exhausted: set[str] = set()
        self._closed: tuple[int, dict[str, float]] = (-1, {})

    def charge(self, job: SimJob, now: float) -> None:
        """A finished job's GPU seconds (and, run in fast, its fast seconds)."""
        account, run_s = job.arrival.account, job.arrival.run_s
        bucket = self.buckets.setdefault(int(now) // USAGE_BUCKET_S, {})
        bucket[account] = bucket.get(account, 0.0) + run_s
        if job.lane == "fast":
            left = self.fast_left.get(account, self.config.fast_seconds) - run_s
            self.fast_left[account] = left
            if left <= 0:
                self.exhausted.add(account)

    def recent(self, now: float) -> dict[str, float]:
        """GPU seconds per account over the fair window (``heartbeat.recent_usage``):
        the same buckets, the closed ones summed once per bucket, not every round."""
        newest = int(now) // USAGE_BUCKET_S
        if self._closed[0] != newest:
            self._closed = (newest, _summed(
                self.buckets.get(bucket, {}) for bucket in
                range(newest - int(self.config.fair_window_s) // USAGE_BUCKET_S, newest)))
        return _summed((self._closed[1], self.buckets.get(newest, {})))


def _summed(buckets: Iterable[Mapping[str, float]]) -> dict[str, float]:
    usage: dict[str, float] = {}
    for counts in buckets:
        for account, seconds in counts.items():
            usage[account] = usage.get(account, 0.0) + seconds
    return usage


class Beat:
    """The leading beat: a heartbeat round, then the movers, every ``heartbeat_s``."""

    def __init__(self, clock: Clock, cluster: Cluster, config: SimConfig, store: Store,
                 accounts: Accounts, on_round: Callable[[dict], None]) -> None:
        self.clock, self.cluster, self.lists = clock, cluster, cluster.lists
        self.config, self.store, self.accounts = config, store, accounts
        self.on_round = on_round
        self.record: dict[str, dict] = {}
        self.policy: dict[str, dict] = {}
        self.pushed: dict[str, tuple[float, dict]] = {}

    # --- the workers' own pushes -------------------------------------------------------
    def schedule_pushes(self, until: Callable[[], bool]) -> None:
        """Each worker pushes its stats every heartbeat at a phase of its own (here:
        one of ``push_phases``), so beat reads stats up to a heartbeat old."""
        phases, period = self.config.push_phases, self.config.heartbeat_s
        groups: list[list[str]] = [[] for _ in range(phases)]
        for i, host in enumerate(self.cluster.workers):
            groups[i % phases].append(host)
        for k, hosts in enumerate(groups):
            self.clock.every(period, lambda hosts=hosts: self._push(hosts),
                             self.clock.now + period * (k + 0.5) / phases, until)

    def _push(self, hosts: list[str]) -> None:
        now, workers = self.clock.now, self.cluster.workers
        for host in hosts:
            worker = workers[host]
            if worker.alive:
                self.pushed[host] = (now, worker.stats(now))

    # --- a round -----------------------------------------------------------------------
    def round(self) -> None:
        """One heartbeat (snapshot, health) and one movers round."""
        now = self.clock.now
        window = self.config.heartbeat_s + self.config.heartbeat_reply_s
        replies = {host: stats for host, (at, stats) in self.pushed.items() if at >= now - window}
        self.record = merge(self.record, replies, now, self.config.misses_allowed)
        snapshot = self._snapshot(now)
        self.store.write(snapshot)
        self._heal(now)
        handed = self.give_idle_work()
        moved = self.enforce_deadlines(now)
        lifted = self.age_relaxed(now)
        self.on_round({"at": now, "lanes": snapshot["lanes"], "policy": snapshot["policy"],
                       "moved": moved, "lifted": lifted, "handed": handed})

    def _snapshot(self, now: float) -> dict[str, Any]:
        """``heartbeat.build_snapshot`` over the simulated lists."""
        config, lengths = self.config, self.lists.lengths()
        depths = lane_depths(None, self.record, lengths)
        loads = lane_loads(self.record, depths, config.default_service_s,
                           self._queued_sample(lengths),
                           admission_waits(config.budgets_s, config.release_ratio))
        policy = next_policy(self.policy, loads, config.budgets_s, config.release_ratio,
                             config.release_samples)
        self.policy = policy
        return {"at": now, "measured_at": now, "epoch": 1, "lanes": loads, "policy": policy,
                "workers": self.record, "exhausted": sorted(self.accounts.exhausted),
                "levels": relax_levels(self.accounts.recent(now), config.fair_unit_s)}

    def _queued_sample(self, lengths: dict[str, dict[str, int]]) -> dict[str, list]:
        """``beat.costs.queued_sample`` over the simulated lists (the same plan)."""
        sample: dict[str, list] = {}
        for lane, per_list in lengths.items():
            plan = sample_plan(per_list)
            sample[lane] = [(job.arrival.model, job.arrival.cost, per_list[key] / n)
                            for key, n in plan.items()
                            for job in self.lists.front_of(key, n)]
        return sample

    # --- health ------------------------------------------------------------------------
    def _heal(self, now: float) -> None:
        """Held jobs of dead incarnations back to their lists (once the dead runner's
        lease lapsed); a dead worker's own queues back to the shared lanes."""
        held = self.cluster.held
        dead = dead_incarnations({who for _, who, _, _ in held.values()}, self.record,
                                 self.config.misses_allowed)
        died = self.cluster.died
        for job_id, (_, who, _, _) in list(held.items()):
            if who in dead and who in died and now - died[who] >= self.config.lease_s:
                self.cluster.put_back(job_id)
        for host, worker in self.record.items():
            if not serving(worker) and worker.get("queued"):
                self.return_to_shared(host)

    def return_to_shared(self, host: str) -> int:
        """``beat.shared.return_to_shared_lanes``: every list of the worker's own queues
        to the front of the shared list of the same lane and step, in order."""
        moved = 0
        for lane in LANES:
            for own, shared in zip(lane_keys(worker_queue(lane, host)), lane_keys(lane)):
                jobs = self.lists.front_of(own, MOVES_PER_ROUND)
                for job in reversed(jobs):  # the oldest ends at the very front
                    self.lists.remove(job)
                    job.node = None
                    self.cluster.push(job, shared, front=True)
                moved += len(jobs)
        return moved

    def give_idle_work(self) -> int:
        """``beat.balance.give_idle_work`` over the simulated lists: stuck fast jobs to
        a holder with no fast work, the youngest jobs of the own queues that wait longest
        to idle workers holding their models."""
        lists = self.lists

        def read(keys: list[str], count: int) -> list[list[tuple[str, float, SimJob]]]:
            return [[(job.arrival.model, job.lane_since, job)
                     for job in lists.youngest(key, count)] for key in keys]

        moves = choose(self.record, lists.list_depth, read, self.clock.now,
                       self.config.heartbeat_s, self.config.default_service_s)
        for queued, host in moves:  # (still queued: nothing runs within a round)
            job = queued.ref
            lists.remove(job)
            job.node = host
            self.cluster.push(job, target_key(queued.key, host))
        return len(moves)

    # --- movers ------------------------------------------------------------------------
    def enforce_deadlines(self, now: float) -> dict[str, int]:
        """``beat.movers.enforce_deadlines``: a downgradable job past its lane's budget
        to the lane below (its clock restarts there, ``moved_to``): the front of
        standard, the back of relaxed's first level (the worker's own, for a job queued
        for a worker), each round's in order of age."""
        moved = {}
        for lane, budget_s in self.config.budgets_s.items():
            lower = next_lane(lane)
            batch = [job for job in self.lists.due_before(lane, now - budget_s, MOVES_PER_ROUND)
                     if job.downgradable]  # the others leave the index
            back = lower == RELAXED
            for job in (batch if back else reversed(batch)):
                target = moved_to(job.key, lower)
                self.lists.remove(job)
                job.downgraded_from, job.reason = job.arrival.tier, WAITED_PAST_BUDGET
                job.lane_since, job.node, job.priority = now, node_of(target) or None, 0
                self.cluster.push(job, target, front=not back)
            moved[lane] = len(batch)
        return moved

    def age_relaxed(self, now: float) -> int:
        """``beat.movers.age_relaxed``: relaxed jobs waiting ``fair_aging_s`` from any
        level to the back of level 0 of their own list, in order of age."""
        batch = self.lists.due_before("relaxed", now - self.config.fair_aging_s,
                                      MOVES_PER_ROUND)
        for job in batch:
            target = job.key.partition(PRIORITY_SEP)[0]
            self.lists.remove(job)
            job.priority = 0
            self.cluster.push(job, target)
        return len(batch)
