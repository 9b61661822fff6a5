"""The submitting side: ``submit()``'s routing on the real snapshot cache, or plain lanes.

gpulanes: a real :class:`routing.snapshot.SnapshotCache` on the virtual clock reads
what the simulated beat wrote (refreshed every half heartbeat, as
``tasks.broker.view.snapshot_cache`` is), and ``routing.policy.decide`` places each
job. The publish's conditions are the ones ``tasks.broker.enqueue.enqueue`` reacts to
(a lane at its maximum depth, an account out of fast places or fast seconds): that
loop has no pure function under its publish, so it is followed here step by step.

Plain lanes: each job to the shared list of its tier, nothing else.
"""
from __future__ import annotations

from dataclasses import replace
from typing import Callable

from routing.lanes import Route
from routing.names import FAST, RELAX_LEVEL_PRIORITIES, STANDARD, first_level
from routing.fair import at_level, depths_ahead, fair_level, queued_level
from routing.policy import Admission, PolicyView, decide, publish_limits
from routing.snapshot import SnapshotCache

from benchmarks.simulate.cluster import Cluster
from benchmarks.simulate.config import SimConfig
from benchmarks.simulate.control import Accounts, Store
from benchmarks.simulate.engine import Clock
from benchmarks.simulate.queues import SimJob, list_key
from benchmarks.simulate.workload import Arrival

#: ``enqueue.TIER_LANES_ONLY``: the view without a fresh snapshot.
TIER_LANES_ONLY = PolicyView()


def new_job(job_id: int, arrival: Arrival, now: float) -> SimJob:
    """A job as ``submit()`` validates it at ``now``: standard may move down, fast may not."""
    return SimJob(job_id, arrival, arrival.tier, arrival.tier == STANDARD, now, now)


class Router:
    """One submitting process routing every job (``submit()`` -> ``enqueue``)."""

    def __init__(self, clock: Clock, cluster: Cluster, config: SimConfig, store: Store,
                 accounts: Accounts) -> None:
        self.clock, self.cluster, self.lists = clock, cluster, cluster.lists
        self.config, self.accounts = config, accounts
        self.cache = SnapshotCache(lambda: store.compact, refresh_s=config.heartbeat_s / 2,
                                   stale_s=config.stale_s, max_depth=config.max_depth,
                                   clock=clock.time, epsilon=config.epsilon,
                                   fetch_members=store.members.get)
        self.cache._thread = object()  # refreshed by the clock's events, not a thread
        self.refused = 0

    def schedule(self, until: Callable[[], bool]) -> None:
        """The cache's background refresh, every half heartbeat."""
        period = self.config.heartbeat_s / 2
        self.clock.every(period, self.cache.refresh, self.clock.now + period * 0.37, until)

    def submit(self, job: SimJob) -> bool:
        """Route and publish ``job``; False when every lane refused it (``LaneFull``)."""
        view = self.cache.view() or TIER_LANES_ONLY
        refused = self.cache.refused()
        if refused:
            view = replace(view, full=view.full | refused)
        if shut := self.cache.shut():
            view = view.shut(shut)
        over_fast_limit, arrival = False, job.arrival
        model = arrival.model if self.config.route_hashing else None
        where = decide(arrival.tier, arrival.account, job.downgradable, view, model)
        while where is not None:
            admit = view.admit.get(where.lane) if job.downgradable else None
            level = self._level(where, arrival.account, view)
            why = self._refusal(where.lane, arrival.account, over_fast_limit, admit, level)
            if why is None:
                self._publish(job, where, level)
                return True
            if why == "full":
                if not level:  # (a later level's refusal holds the lane full to this job only)
                    self.cache.note_full(where.lane)
                view = replace(view, full=view.full | {where.lane})
            elif why == "over_budget":
                if not level:  # (a later level's refusal shuts the lane to this job only)
                    self.cache.note_over_budget(where.lane, view.admit[where.lane])
                view = view.shut({where.lane})
            elif why == "fast_time":
                view = replace(view, exhausted=view.exhausted | {arrival.account})
            else:
                over_fast_limit = True
            where = decide(arrival.tier, arrival.account, job.downgradable, view, model,
                           over_fast_limit)
        self.refused += 1
        return False

    def _level(self, where: Route, account: str, view: PolicyView) -> int | None:
        """The level a fast or standard job enters at (``lua/fair.lua``): its usage level,
        raised by its account's jobs waiting there; None: levels do not apply."""
        level = fair_level(where, account, view)
        if level is None:
            return None
        lists = self.lists
        waiting = lists.waiting[(where.lane, account)]
        return max(level, queued_level(waiting, lists.lane_depth[where.lane],
                                       lists.waiting_accounts[where.lane]))

    def _refusal(self, lane: str, account: str, over_fast_limit: bool,
                 admit: Admission | None = None, level: int | None = None) -> str | None:
        """Why the publish script refuses a job in ``lane`` (``tasks.broker.publish``); an
        admission counts what waits at the job's ``level`` or before (``depths_ahead``)."""
        lists = self.lists
        for limit in publish_limits(lane, self.config.max_depth[lane], admit):
            depths = lists.lane_depth if limit.why == "full" else depths_ahead(
                lists.lane_depth, lists.level_depth, lane, level)
            if at_level(limit, level).reached(depths):
                return limit.why  # "full", "over_budget"
        if lane != FAST:
            return None
        if account in self.accounts.exhausted:
            return "fast_time"
        limit = self.config.fast_jobs_per_account
        if limit and not over_fast_limit and self.lists.fast_queued[account] >= limit:
            return "fast_places"
        return None

    def _publish(self, job: SimJob, where: Route, level: int | None = None) -> None:
        """``level``: a fast or standard job's (``_level``)."""
        priority = where.priority if level is None else RELAX_LEVEL_PRIORITIES[level]
        job.priority, job.node = priority, where.node
        job.downgraded_from, job.reason = where.downgraded_from, where.downgrade_reason
        self.cluster.push(job, list_key(where.queue, priority))
        if level is not None and job.key is not None:  # (not taken at once)
            self.lists.count(job)
        self.cache.note_sent(where.lane, where.node, job.arrival.model,
                             first_level(where.lane, priority))


class PlainRouter:
    """Plain lanes: ``apply_async(queue=tier)``, no limit, no routing."""

    def __init__(self, cluster: Cluster) -> None:
        self.cluster, self.refused = cluster, 0

    def schedule(self, until: Callable[[], bool]) -> None:
        """Nothing to refresh."""

    def submit(self, job: SimJob) -> bool:
        self.cluster.push(job, job.arrival.tier)
        return True
