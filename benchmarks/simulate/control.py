"""Beat's rounds on the virtual clock, through beat's own pure functions and its
round-to-round state.

Called as ``beat.heartbeat.heartbeat`` calls them: the worker record kept in memory
(``beat.record.Record``: only the stats changed since the last round folded in, the
workers fallen silent missed, the waning ones' busy slots decayed; a worker that
misses ``misses_allowed`` rounds in a row is dead), the lists' depths and each worker's
queued counts (``beat.depths.Depths``: only the lists whose depth changed), the idle and
the unserved workers (``beat.standing.Standing``) and the pools' figures
(``beat.tally.Tally``) kept a changed worker at a time, ``beat.costs.sample_plan``
(which queued jobs price each lane), ``lane_loads`` (expected waits, on the tally's
sums), ``next_policy`` (hysteresis), ``relax_levels``, ``routing.splitter.Splitter``
(the two parts routers read, only the changed workers worked out again),
``beat.health.dead_incarnations``, ``beat.balance.choose`` (stuck fast jobs and idle
workers' share of queued jobs, the idle workers as beat keeps them). A round costs
what changed, not the number of workers; a running worker's busy time changes every
round, and of a worker whose busy slots alone changed only the pools' busy slots are
taken in anew (what the rest reads of it is as it was). What has no pure function
underneath its Redis calls is done here, the decision each makes kept as the real
code states it: the stats pushes and a round's read of them
(``benchmarks.simulate.stats``, after ``tasks.broker.stats``), putting a dead worker's
held jobs back (``tasks.broker.handover.put_back_all``: once its lease lapsed), handing
a dead or unknown worker's own queues back (``beat.shared``), and both movers
(``beat.movers``: the ``due`` closures inside ``enforce_deadlines`` and
``age_relaxed``).
"""
from __future__ import annotations

import json
from typing import Any, Callable, Collection, Iterable, Mapping

from beat.balance import choose, node_of, target_key
from beat.costs import sample_plan
from beat.depths import Depths
from beat.health import dead_incarnations
from beat.movers import moved_to
from beat.record import FORGET_AFTER_S, Record
from beat.snapshot import lane_loads, next_policy
from beat.standing import Standing
from beat.tally import Tally
from routing.names import FAST, LANES, RELAXED, worker_queue
from routing.policy import WAITED_PAST_BUDGET, admission_waits, next_lane, relax_levels
from routing.splitter import Splitter
from tasks.broker.keys import PRIORITY_SEP, USAGE_BUCKET_S, lane_keys
from tasks.broker.moves import MOVES_PER_ROUND
from tasks.broker.stats import Round

from benchmarks.simulate.cluster import Cluster
from benchmarks.simulate.config import SimConfig
from benchmarks.simulate.engine import Clock
from benchmarks.simulate.queues import Lists, SimJob
from benchmarks.simulate.stats import Pushed

#: Members documents kept (a router reads the newest; a few older ones for a slow one).
MEMBERS_KEPT = 8


class Store:
    """What beat writes and routers read: the compact snapshot and members documents."""

    def __init__(self) -> None:
        self.compact: str | None = None
        self.members: dict[str, str] = {}
        self.splitter = Splitter()

    def write(self, snapshot: dict, changed: Collection[str] | None = None) -> None:
        """``heartbeat.write_round``: the two parts of ``snapshot`` (``changed``: the
        workers whose record changed since the last write; None: any), a members doc
        written whole only for a version not written yet."""
        compact, members = self.splitter.split(snapshot, changed)
        self.compact = json.dumps(compact, separators=(",", ":"))
        if members["version"] not in self.members:
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


class Tallied(Tally):
    """``beat.tally.Tally``, and a cheaper way to take in workers whose busy slots alone
    changed (what a running worker's push changes, round after round)."""

    def rebusy(self, workers: Mapping[str, Mapping[str, Any]], hosts: Iterable[str]) -> None:
        """Take the busy slots of ``hosts`` as they are now, their other figures as
        they were: what ``update`` gives them (its subtraction and addition)."""
        for host in hosts:
            part = self.parts[host]
            if part.sums is None:  # serves no jobs: counts no busy slots
                continue
            busy, mine = workers[host].get("busy") or {}, part.sums.busy
            total = self.pools[part.pool].sums.busy
            for lane in LANES:
                total[lane] += -mine[lane]
                mine[lane] = 0.0 + busy.get(lane, 0.0)
                total[lane] += mine[lane]


class Kept(Record):
    """``beat.record.Record`` as a leader whose mark is on the stored record keeps it:
    each round folds in what a round's read found (``Record.round``, steady)."""

    def __init__(self) -> None:
        super().__init__(tally=Tallied())
        #: Of the changed workers, those whose busy slots alone changed this round (a
        #: running worker's push, a waning worker's decay): beat's own parts of them,
        #: but for the pools' busy slots, are as they were.
        self.busy_only: set[str] = set()

    def fold(self, found: Round, now: float, misses_allowed: int,
             busy_only: Iterable[str] = ()) -> dict[str, dict]:
        """``Record._fold`` of ``found``; ``busy_only``: the workers heard whose stats
        differ from their last in their busy time alone."""
        before = self.workers
        steady = {host for host in busy_only
                  if (old := before.get(host)) is not None and old.get("alive")
                  and not old.get("missed")}
        self._fold(found, now, misses_allowed)
        decayed = {host for host in self.changed or () if host not in found.heard
                   and host not in self.silent and host in self.workers}
        self.busy_only = steady | decayed
        return self.workers

    def tallied(self) -> Tally:
        """``Record.tallied``, the changed workers taken in order (the same sums on any
        machine: floats added in another order may round apart), those whose busy
        slots alone changed only for those."""
        self.tally.update(self.workers, sorted((self.changed or set()) - self.busy_only))
        self.tally.rebusy(self.workers, sorted(self.busy_only))
        return self.tally


class ListDepths(Depths):
    """``beat.depths.Depths`` over the simulated lists: a round takes in the lists whose
    depth changed (``Lists.changed_lists``), as ``Depths.read`` takes in those whose
    counter differs from the last read."""

    def take(self, lists: Lists) -> set[str]:
        """Take in the lists' depths now; the owners whose counts changed."""
        touched: set[str] = set()
        for key in lists.changed_lists():
            self._set(key, lists.list_depth.get(key, 0), touched)
        return touched


class Beat:
    """The leading beat: a heartbeat round, then the movers, every ``heartbeat_s``."""

    def __init__(self, clock: Clock, cluster: Cluster, config: SimConfig, store: Store,
                 accounts: Accounts, on_round: Callable[[dict], None]) -> None:
        self.clock, self.cluster, self.lists = clock, cluster, cluster.lists
        self.config, self.store, self.accounts = config, store, accounts
        self.on_round = on_round
        self.kept, self.depths, self.standing = Kept(), ListDepths(), Standing()
        self.policy: dict[str, dict] = {}
        self.pushed = Pushed()

    @property
    def record(self) -> dict[str, dict]:
        """The worker record as of the last round."""
        return self.kept.workers

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
        now, workers, pushed = self.clock.now, self.cluster.workers, self.pushed
        for host in hosts:
            worker = workers[host]
            if worker.alive:
                pushed.push(host, *worker.push(now), now)
            else:
                pushed.skipped(host)

    # --- a round -----------------------------------------------------------------------
    def round(self) -> None:
        """One heartbeat (snapshot, health) and one movers round."""
        now, config, kept = self.clock.now, self.config, self.kept
        found = self.pushed.read_round(now, config.heartbeat_s + config.heartbeat_reply_s,
                                       kept.cutoff, FORGET_AFTER_S, sorted(kept.silent))
        workers = kept.fold(found, now, config.misses_allowed, self.pushed.busy_only)
        touched = self.depths.take(self.lists)  # the owners of lists whose depth changed
        kept.mark_changed(self.depths.counted(workers, kept.changed | touched))
        kept.busy_only -= touched
        # what idle, unserved and the split read of a worker but its busy slots: the
        # same for those whose busy slots alone changed
        changed = kept.changed - kept.busy_only
        self.standing.update(workers, changed)
        snapshot = self._snapshot(now, kept.tallied())
        self.store.write(snapshot, changed)
        self._heal(now)
        handed = self.give_idle_work()
        moved = self.enforce_deadlines(now)
        lifted = self.age_relaxed(now)
        self.on_round({"at": now, "lanes": snapshot["lanes"], "policy": snapshot["policy"],
                       "moved": moved, "lifted": lifted, "handed": handed})

    def _snapshot(self, now: float, tally: Tally) -> dict[str, Any]:
        """``heartbeat.build_snapshot`` over the simulated lists, on the pools' figures
        as beat keeps them (``tally``) and the depths it read."""
        config, lengths = self.config, self.depths.lengths
        loads = lane_loads(self.record, self.depths.totals(), config.default_service_s,
                           self._queued_sample(lengths),
                           admission_waits(config.budgets_s, config.release_ratio),
                           tally.serving())
        policy = next_policy(self.policy, loads, config.budgets_s, config.release_ratio,
                             config.release_samples)
        self.policy = policy
        return {"at": now, "measured_at": now, "epoch": 1, "lanes": loads, "policy": policy,
                "workers": self.record, "exhausted": sorted(self.accounts.exhausted),
                "levels": relax_levels(self.accounts.recent(now), config.fair_unit_s)}

    def _queued_sample(self, lengths: Mapping[str, Mapping[str, int]]) -> dict[str, list]:
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
        """``heartbeat.requeue_dead``: held jobs of dead incarnations back to their lists
        (once the dead runner's lease lapsed; only a dead process's lease lapses); then
        the own queues of the workers that serve no more, and of unknown ones, back to
        the shared lanes."""
        cluster, died, holding = self.cluster, self.cluster.died, self.cluster.holding
        holders = [who for who in died if who in holding]
        dead = dead_incarnations(holders, self.record, self.config.misses_allowed)
        for who in sorted(dead, key=holding.__getitem__):  # in the order they took them
            if now - died[who] >= self.config.lease_s:
                cluster.put_back(holding[who][1])
        for host in sorted(self.standing.unserved & self.depths.owners.keys()):
            self.return_to_shared(host)
        for host in sorted(self.depths.unknown(self.record)):
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
        to idle workers holding their models (the idle workers as ``Standing`` keeps
        them; with none, only the fast lists are weighed)."""
        lists, lengths = self.lists, self.depths.lengths

        def read(keys: list[str], count: int) -> list[list[tuple[str, float, SimJob]]]:
            return [[(job.arrival.model, job.lane_since, job)
                     for job in lists.youngest(key, count)] for key in keys]

        idle_hosts = sorted(self.standing.idle)
        weighed = lengths.values() if idle_hosts else [lengths.get(FAST, {})]
        moves = choose(self.record, (key for per_list in weighed for key in per_list), read,
                       self.clock.now, self.config.heartbeat_s,
                       self.config.default_service_s, idle_hosts)
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
