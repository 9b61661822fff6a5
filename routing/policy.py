"""Lane policy as pure functions of (job, snapshot): load, hysteresis, downgrade.

Beat feeds measured samples through :func:`next_state`; ``submit()`` calls
:func:`decide` with the latest :class:`PolicyView` it holds in memory. Nothing
here touches the network, so unit tests drive it with synthetic series.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import AbstractSet, Any, Mapping, NamedTuple

from routing.lanes import Route
from routing.names import FAST, LANES, RELAX_LEVEL_PRIORITIES, RELAXED, STANDARD
from routing.placement import home

#: Reasons a job runs below its tier; they appear in results and metrics.
FAST_TIME_EXHAUSTED = "fast_time_exhausted"
FAST_ACCOUNT_LIMIT = "fast_account_limit"
FAST_OVERLOADED = "fast_overloaded"
STANDARD_OVERLOADED = "standard_overloaded"
LANE_FULL = "lane_full"
WAITED_PAST_BUDGET = "waited_past_budget"
RETRY = "retry"
#: Moves down made by the cluster's load, not by the account's own limits: such a job
#: keeps its place in time in relaxed, in the first step with the jobs that aged or
#: waited past their budget (oldest first), not behind the relaxed backlog at its
#: account's level, where it would wait out the overload with the relaxed jobs.
MOVED_BY_LOAD = frozenset({FAST_OVERLOADED, STANDARD_OVERLOADED, LANE_FULL})
#: A wait that stands for "no healthy worker": never met by any budget.
NO_CAPACITY_WAIT_S = 86400.0


def next_lane(lane: str) -> str | None:
    """The lane one step down, or None below relaxed."""
    index = LANES.index(lane)
    return LANES[index + 1] if index + 1 < len(LANES) else None


#: Hysteresis: an overloaded lane is normal again after RELEASE_SAMPLES samples in a
#: row below RELEASE_RATIO x its budget (``next_state``); a job enters a budgeted lane
#: while it would start within that share of the budget (``admission_waits``).
RELEASE_RATIO = 0.9
RELEASE_SAMPLES = 3
#: GPU seconds in the fair-share window that move an account down one relaxed level
#: (``relax_levels``).
FAIR_UNIT_S = 60.0


@dataclass(frozen=True)
class Hysteresis:
    """A lane's overload state: on at once, off only after a calm streak."""

    overloaded: bool = False
    calm_samples: int = 0


def next_state(state: Hysteresis, wait_s: float, budget_s: float,
               release_ratio: float, release_samples: int) -> Hysteresis:
    """Fold one expected-wait sample into the state.

    Overloaded as soon as ``wait_s >= budget_s``; normal again only after
    ``release_samples`` consecutive samples below ``release_ratio * budget_s``.
    A sample in between keeps an overloaded lane overloaded and restarts the
    streak, so noise around the threshold cannot make it flap.
    """
    if wait_s >= budget_s:
        return Hysteresis(True, 0)
    if not state.overloaded:
        return state
    if wait_s >= release_ratio * budget_s:
        return Hysteresis(True, 0)
    calm = state.calm_samples + 1
    return Hysteresis(False, 0) if calm >= release_samples else Hysteresis(True, calm)


#: The share of the job slots a lane is always granted in a wait estimate, however busy
#: the lanes above keep the pool (``expected_waits``): a lane they starve waits 1 / it.
MIN_FREE_SHARE = 0.05


def free_slots(workers: float, busy: Mapping[str, float] | None = None) -> dict[str, float]:
    """Job slots each lane has: the pool's, less those the lanes above it keep busy on
    average (``busy``, measured), at least ``MIN_FREE_SHARE`` of the pool."""
    free, above = {}, 0.0
    for lane in LANES:
        free[lane] = max(workers - above, MIN_FREE_SHARE * workers)
        above += (busy or {}).get(lane, 0.0)
    return free


def expected_waits(depths: Mapping[str, int], service_s: Mapping[str, float],
                   in_flight: int, workers: int,
                   running_s: float | None = None,
                   busy: Mapping[str, float] | None = None) -> dict[str, float]:
    """Seconds a job entering each lane now waits before it starts.

    Lanes are served in strict priority, FIFO within a lane: a job entering
    lane L waits for every queued job in L and the lanes above it (``service_s``:
    seconds per queued job of each lane), plus on average half of each running job
    (``running_s`` each; default: the lanes' mean), spread over the healthy workers'
    job slots (``workers``: the sum of their concurrency). The jobs of the lanes above
    that arrive meanwhile go first too: ``busy``, the slots each lane keeps busy on
    average, is taken from the slots of the lanes below it (``free_slots``).
    """
    if workers <= 0:
        return {lane: NO_CAPACITY_WAIT_S for lane in LANES}
    if running_s is None:
        running_s = sum(service_s[lane] for lane in LANES) / len(LANES)
    free = free_slots(workers, busy)
    waits, work_s = {}, in_flight * running_s / 2
    for lane in LANES:
        work_s += depths.get(lane, 0) * service_s[lane]
        waits[lane] = work_s / free[lane]
    return waits


class DepthLimit(NamedTuple):
    """A limit a publish must pass on the live lane depths, checked in the step that
    pushes (``tasks.broker.publish``): refused, as ``why``, when the depths weighed by
    ``weights`` sum to ``bound`` or more. The policy states the numbers; the publish
    script only evaluates this one rule, and the simulator the same (``reached``)."""

    why: str
    bound: float
    #: (lane, weight per queued job) of each lane counted.
    weights: tuple[tuple[str, float], ...]

    def reached(self, depths: Mapping[str, int]) -> bool:
        return sum(depths.get(lane, 0) * weight for lane, weight in self.weights) >= self.bound


class Admission(NamedTuple):
    """A budgeted lane's admission, checked by the publish on the live depths
    (``over_budget``)."""

    #: The most queued work, in job-slot seconds, ahead of a job let in.
    bound_s: float
    #: (lane, seconds per queued job) of the lane and each lane above it.
    per_job_s: tuple[tuple[str, float], ...]
    #: The wait that bound stands for (``admission_waits``).
    wait_s: float

    @property
    def limit(self) -> DepthLimit:
        """The work queued ahead, each lane's jobs priced, under the bound."""
        return DepthLimit("over_budget", self.bound_s, self.per_job_s)


def publish_limits(lane: str, max_depth: int,
                   admission: Admission | None) -> tuple[DepthLimit, ...]:
    """What a new job's publish to ``lane`` must pass: the lane's maximum depth (0: none;
    refused as ``full``), then, for a job that may move down, the lane's admission. A job
    accepted before (a retry, a coalesced run's heir) passes none: it is never dropped
    for want of room."""
    limits = (DepthLimit("full", max_depth, ((lane, 1.0),)),) if max_depth > 0 else ()
    return limits + ((admission.limit,) if admission is not None else ())


#: A lane that refused a job for its admission is shut to the submitting process's
#: jobs for this share of its admission wait (``routing.snapshot.SnapshotCache.shut``):
#: they go down a lane at once, with no publish tried, so that an overloaded lane costs
#: a moved job one publish, not two; the lane drains this share of its wait meanwhile,
#: never all of it.
ADMIT_HOLD_SHARE = 0.1


def admission_waits(budgets_s: Mapping[str, float], release_ratio: float) -> dict[str, float]:
    """The wait each budgeted lane lets a job in at (``Admission``): the level below which
    the lane counts as calm again (``next_state``), so that the jobs it lets in never make
    it overloaded by themselves. The overload state and its hysteresis answer what they
    cannot: a surge in the lanes above, capacity lost, a beat that stopped."""
    return {lane: release_ratio * budget_s for lane, budget_s in budgets_s.items()}


#: How many standard deviations of the work the lanes above send meanwhile an admitted
#: job's wait is kept within its admission wait (``admitted_wait``).
ADMIT_SPREAD_Z = 2.0


def admitted_wait(target_s: float, above: Mapping[str, tuple[float, float]],
                  free: float) -> float:
    """The expected wait an admission lets a job in at, so that its wait stays within
    ``target_s`` (``admission_waits``) even when the lanes above send more than their
    mean meanwhile.

    A job that waits W on ``free`` job slots also waits for the jobs the lanes above send
    in W: ``above`` holds each such lane's (busy slots, seconds per job). Arriving at
    random, they bring busy x W slot-seconds on average, give or take
    sqrt(busy x job_s x W) (a Poisson count of jobs of job_s each), which spread over the
    free slots is the wait's own spread. W plus ``ADMIT_SPREAD_Z`` of it meets target_s at
    W = ((-c + sqrt(c^2 + 4 target_s)) / 2)^2, c = z sqrt(sum busy x job_s) / free. Few
    slots or long jobs above spread the wait most; at a fleet's scale W is target_s but
    for a percent or two.
    """
    spread = sum(max(0.0, busy * job_s) for busy, job_s in above.values())
    if target_s <= 0 or free <= 0 or not math.isfinite(spread):
        return max(0.0, target_s)  # a malformed reply widens nothing
    c = ADMIT_SPREAD_Z * math.sqrt(spread) / free
    return ((-c + math.sqrt(c * c + 4 * target_s)) / 2) ** 2


def admissions(lanes: Mapping[str, Mapping[str, Any]]) -> dict[str, Admission]:
    """Each budgeted lane's admission, from a snapshot's lane loads
    (``beat.snapshot.lane_loads``: ``admit_s``, ``admit_wait_s``, ``queued_job_s``)."""
    per_job = tuple((lane, float(lanes.get(lane, {}).get("queued_job_s", 0.0)))
                    for lane in LANES)
    return {lane: Admission(float(load["admit_s"]), per_job[:LANES.index(lane) + 1],
                            float(load.get("admit_wait_s", 0.0)))
            for lane, load in lanes.items() if "admit_s" in load and lane in LANES}


def over_budget(depths: Mapping[str, int], admission: Admission) -> bool:
    """Whether a job entering the lane now would start later than its admission allows:
    the work queued ahead of it (``depths``, live) at or past the bound: the limit the
    publish enforces (``Admission.limit``)."""
    return admission.limit.reached(depths)


def relax_levels(usage_s: Mapping[str, float], unit_s: float) -> dict[str, int]:
    """Relaxed-lane level per account from its recent GPU seconds (0 goes first).

    Under ``unit_s`` of GPU time in the window: level 0; under 4 units: 1;
    under 16 units: 2; beyond: 3. A newcomer is always level 0, so it goes
    ahead of anyone who has used the cluster heavily. Only levels above 0
    are listed.
    """
    levels = {}
    for account, used in usage_s.items():
        level = next((n for n, bound in enumerate((1, 4, 16)) if used < bound * unit_s), 3)
        if level:
            levels[account] = level
    return levels


@dataclass(frozen=True)
class PolicyView:
    """What routing needs to know of the cluster, as of ``at``."""

    at: float = 0.0
    overloaded: frozenset[str] = frozenset()
    full: frozenset[str] = frozenset()
    exhausted: frozenset[str] = frozenset()
    levels: Mapping[str, int] = field(default_factory=dict)
    retry_after_s: float = 1.0
    #: Healthy workers on the consistent-hash ring, and their loads (jobs
    #: running or queued for each); empty: every job goes to the shared lanes.
    ring: tuple[tuple[int, ...], tuple[str, ...]] = ((), ())
    loads: Mapping[str, float] = field(default_factory=dict)
    #: What a fast job would wait for on each worker (``routing.compact.fast_work``), with
    #: this process's fast sends. None: fast jobs are placed by ``loads``.
    fast_loads: Mapping[str, float] | None = None
    #: What a first-level standard job would wait for on each worker
    #: (``routing.compact.first_work``), with this process's such sends and fast ones.
    #: None: such jobs are placed by ``loads``.
    first_loads: Mapping[str, float] | None = None
    epsilon: float = 0.25
    #: Models each healthy worker holds warm (or is loading), least recently used first.
    warm: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    #: Kept by the snapshot cache, so that a job does not pass over every worker: the
    #: sum of ``loads`` over the ring, and model -> the ring's workers holding it warm
    #: (None: found from ``loads`` and ``warm`` per job).
    load_sum: float | None = None
    holders: Mapping[str, AbstractSet[str]] | None = None
    #: MB each worker's models may take, and seconds per queued job (service time /
    #: concurrency); each model's size in MB as workers reported it.
    budget_mb: Mapping[str, int] = field(default_factory=dict)
    drain_s: Mapping[str, float] = field(default_factory=dict)
    model_mb: Mapping[str, int] = field(default_factory=dict)
    #: The largest worker's budget in MB (None: no worker): no larger model can run.
    largest_budget_mb: int | None = None
    #: Measured cold-load seconds per model; ``cold_default_s`` for the others.
    cold_s: Mapping[str, float] = field(default_factory=dict)
    cold_default_s: float = 0.0
    #: Per budgeted lane, what a job must find to enter it (``over_budget``, checked by
    #: the publish on the live depths); a lane not named lets every job in.
    admit: Mapping[str, Admission] = field(default_factory=dict)
    #: Each model's first worker (see ``routing.placement.assign_homes``).
    homes: Mapping[str, str] = field(default_factory=dict)
    #: The share of its ``maxmemory`` Redis used as beat measured it (0: no limit set).
    memory_share: float = 0.0

    def cold_load_s(self, model: str) -> float:
        """What loading ``model`` costs a worker that does not hold it."""
        return self.cold_s.get(model, self.cold_default_s)

    def shut(self, lanes: AbstractSet[str]) -> PolicyView:
        """This view with ``lanes`` overloaded and without their admissions: a job that
        may move down is moved out of them at once (``decide``)."""
        return self.but(overloaded=self.overloaded | lanes,
                        admit={lane: a for lane, a in self.admit.items() if lane not in lanes})

    def but(self, **fields: Any) -> PolicyView:
        """``dataclasses.replace`` without running ``__init__`` again: the snapshot
        cache makes a view per job, and this costs about a microsecond, not ten."""
        unknown = fields.keys() - self.__dict__.keys()
        if unknown:
            raise TypeError(f"PolicyView has no field {', '.join(sorted(unknown))}")
        view = object.__new__(PolicyView)
        view.__dict__.update(self.__dict__, **fields)
        return view


def _moved(route: Route, lane: str, reason: str) -> Route:
    key = (route.requested_tier, lane, reason)
    found = _ROUTES.get(key)
    if found is None:
        found = _ROUTES[key] = Route(lane=lane, requested_tier=route.requested_tier,
                                     downgraded_from=route.requested_tier,
                                     downgrade_reason=reason)
    return found


#: The routes a job starts from, and those it is moved to: a frozen dataclass is made
#: a field at a time (about 2 us), and these few are the same for every job.
_ROUTES: dict[Any, Route] = {tier: Route(lane=tier, requested_tier=tier) for tier in LANES}


def decide(tier: str, account: str, downgradable: bool, view: PolicyView,
           model: str | None = None, over_fast_limit: bool = False,
           route_key: str | None = None) -> Route | None:
    """Where a new job goes; None when even the relaxed lane is full.

    With ``model``, the job goes to its worker's own queue of that lane
    (consistent hashing with bounded loads), else to the shared lane.
    ``over_fast_limit``: the account already has its share of fast jobs
    waiting, so this one runs in standard. ``route_key``: the job's own point on the
    ring (a model's ``route_key(inputs)``), in place of the model's home.
    """
    route = _ROUTES.get(tier) or Route(lane=tier, requested_tier=tier)
    if tier == FAST and account in view.exhausted:
        route = _moved(route, RELAXED, FAST_TIME_EXHAUSTED)
    elif tier == FAST and over_fast_limit:
        route = _moved(route, STANDARD, FAST_ACCOUNT_LIMIT)
    if downgradable and route.lane == FAST and _shut(FAST, view):
        route = _moved(route, STANDARD, FAST_OVERLOADED)
    if downgradable and route.lane == STANDARD and _shut(STANDARD, view):
        route = _moved(route, RELAXED, STANDARD_OVERLOADED)
    while route.lane in view.full:
        lower = next_lane(route.lane)
        if lower is None:
            return None
        route = _moved(route, lower, LANE_FULL)
    priority = _relaxed_step(route, account, view)
    node = None
    if model:
        fast = route.lane == FAST
        node = home(model, view.ring, view.loads, view.epsilon, view.warm, view.drain_s,
                    view.cold_load_s(model), None if route_key else view.homes.get(model),
                    f"{model}/{route_key}" if route_key else None, holders=view.holders,
                    load_sum=view.load_sum, fast_loads=view.fast_loads if fast else None,
                    first_loads=view.first_loads if fast or goes_first(route, account, view)
                    else None)
    if priority or node:
        route = _placed(route, priority, node)
    return route


def goes_first(route: Route, account: str, view: PolicyView) -> bool:
    """Whether a job so routed enters standard's first level (``routing.names.
    FIRST_STEPS``): moved there by the load, or of an account at level 0 by recent usage
    (the publish may still raise its level: ``routing.fair.queued_level``)."""
    return route.lane == STANDARD and (route.downgrade_reason in MOVED_BY_LOAD
                                       or not view.levels.get(account, 0))


def _shut(lane: str, view: PolicyView) -> bool:
    """Whether a job that may move down is moved out of ``lane`` at once: the lane is
    overloaded and has no admission for the publish to check on the live depths (with
    one, the publish lets the job in only while the lane can start it in time)."""
    return lane in view.overloaded and lane not in view.admit


def _relaxed_step(route: Route, account: str, view: PolicyView) -> int:
    """The kombu priority step a job takes: in relaxed its account's level, unless the
    load moved it there (``MOVED_BY_LOAD``: step 0); elsewhere 0 (lane order holds)."""
    if route.lane != RELAXED or route.downgrade_reason in MOVED_BY_LOAD:
        return 0
    return RELAX_LEVEL_PRIORITIES[view.levels.get(account, 0)]


def _placed(route: Route, priority: int, node: str | None) -> Route:
    """``route`` with its priority and worker: one copy of its fields, without the frozen
    dataclass's ``__init__`` (a ``setattr`` per field: microseconds on every job)."""
    placed = object.__new__(Route)
    placed.__dict__.update(route.__dict__, priority=priority, node=node)
    return placed
