"""How many workers a pool needs for every lane to meet its wait budget (pure).

A pool's demand per lane is its arrival rate, the mean seconds of a job and the work
already queued. Lanes are served in priority order, so lane ``k`` competes with the
lanes above it: the workers a budgeted lane needs are those of an M/M/c queue fed by
lanes ``0..k``, sized so that its share ``within`` of jobs starts within the lane's
budget, plus what drains the queued work of those lanes within the budget.

A lane with no budget (relaxed) is not sized like one. Its jobs may wait, so the pool
plans a backlog of them instead of idle workers (:func:`planned`): it needs the workers
the budgeted lanes use, plus those that start the queued work within
:data:`PLANNED_WAIT_S`. While the backlog is shorter than that, the pool may serve less
than its load, every worker busy; once it is that long, the pool serves its whole load.
Idle workers are what a pool pays for and does not use; a backlog of jobs that may
wait keeps them busy through the noise of the arrivals, a rise not yet followed and a
fall not yet trusted. The pool needs the most any lane needs.

:func:`next_scale` turns that need into ``wanted`` with a hysteresis: up at once; down
only after the need stayed lower for ``down_after_s``, by a step past the noise of the
need, and never below the load the pool serves, so a constant load settles and stays.
"""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any, Mapping, Sequence

#: The wait budget of a lane that has none (relaxed): its jobs should start within it.
UNBUDGETED_S = 600.0
#: The wait the backlog of a lane with no budget is planned for: half its budget, the
#: other half left for what the plan does not foresee (a new worker's warm-up, a surge).
PLANNED_WAIT_S = UNBUDGETED_S / 2
#: Most servers :func:`servers_for` considers (past it the load is not servable).
MOST_SERVERS = 100_000
#: Time constants (s) of the quick and slow averages of a rate: the gap between them
#: over a ramp is its slope times the difference of the two.
QUICK_S, SLOW_S = 15.0, 90.0
#: Standard deviations of a rate's noise that a change must pass to count: arrivals
#: are counted as Poisson, whose average over ``tau`` seconds varies by
#: ``sqrt(rate / (2 tau))``.
NOISE_Z = 3.0


def _noise(rate: float, tau_s: float) -> float:
    return math.sqrt(max(rate, 1 / tau_s) / (2 * tau_s))


@dataclass(frozen=True)
class LaneDemand:
    """One lane's demand on a pool."""

    arrivals_s: float  # jobs per second entering the lane
    service_s: float  # mean seconds a job holds a worker
    queued_s: float = 0.0  # worker-seconds of work waiting now
    budget_s: float | None = None  # the wait budget (None: no budget)
    within: float = 0.95  # the share of jobs that must start within the budget


def servers_for(arrivals_s: float, service_s: float, budget_s: float, within: float,
                busy: bool = False) -> int:
    """The fewest servers of an M/M/c queue (``arrivals_s`` jobs/s, ``service_s`` mean
    seconds each) for which ``within`` of the jobs wait at most ``budget_s``:
    ``P(W > t) = C(c, a) * exp(-(c - a) * t / s)`` (Erlang C, ``a = arrivals_s x service_s``).

    ``busy``: the servers are never idle (lower lanes' jobs fill them), so every job
    waits for a run to end: ``C = 1``, and ``c >= a + s * ln(1 / late) / t``."""
    load = arrivals_s * service_s
    if load <= 0:
        return 0
    late_share = max(1e-9, 1.0 - within)
    if busy:
        if budget_s <= 0:
            return MOST_SERVERS
        least = load + service_s * math.log(1 / late_share) / budget_s
        return min(MOST_SERVERS, max(math.floor(load) + 1, math.ceil(least - 1e-9)))
    blocked = 1.0  # Erlang B of c servers, by its recursion from c = 0
    for servers in range(1, MOST_SERVERS + 1):
        blocked = load * blocked / (servers + load * blocked)
        if servers <= load:
            continue
        waiting = servers * blocked / (servers - load * (1 - blocked))  # Erlang C
        if waiting * math.exp(-(servers - load) * budget_s / service_s) <= late_share:
            return servers
    return MOST_SERVERS


def _unbudgeted_demand(lanes: Sequence[LaneDemand]) -> bool:
    return any(lane.budget_s is None and (lane.arrivals_s > 0 or lane.queued_s > 0)
               for lane in lanes)


def needed(lanes: Sequence[LaneDemand], plan_backlog: bool = False) -> float:
    """Workers the pool needs for each of ``lanes`` (highest priority first) to meet its
    goal, as a fraction: the most any lane needs.

    A lane with no budget is held to :data:`UNBUDGETED_S` like a budgeted one (no
    backlog: what a clairvoyant sizes), unless ``plan_backlog``: then it is left to
    :func:`planned`, and the budgeted lanes are sized for servers a backlog keeps busy
    (:func:`servers_for` ``busy``), as it will."""
    busy = plan_backlog and _unbudgeted_demand(lanes)
    need, arrivals_s, work_s, queued_s = 0.0, 0.0, 0.0, 0.0
    for lane in lanes:
        if plan_backlog and lane.budget_s is None:
            continue
        arrivals_s += lane.arrivals_s
        work_s += lane.arrivals_s * lane.service_s
        queued_s += lane.queued_s
        budget_s = UNBUDGETED_S if lane.budget_s is None else lane.budget_s
        service_s = work_s / arrivals_s if arrivals_s else lane.service_s
        served = servers_for(arrivals_s, service_s, budget_s, lane.within, busy)
        # The queued work is started within the budget by the servers' spare capacity
        # (servers - load); past that it needs workers of its own.
        need = max(need, served, work_s + queued_s / max(budget_s, service_s))
    return need


def planned(lanes: Sequence[LaneDemand], wait_s: float = PLANNED_WAIT_S) -> float:
    """Workers that keep the backlog of the lanes with no budget (last in priority)
    within ``wait_s``: the work of the budgeted lanes, served first, plus the queued
    work of every lane over ``wait_s``; 0 if no lane without a budget has demand.

    A job at the back of the backlog starts once the work ahead of it is done by the
    workers the budgeted lanes leave, so these keep its wait at ``wait_s``. Fewer than
    the load: the backlog grows, until it asks for more."""
    if not _unbudgeted_demand(lanes):
        return 0.0
    return sum(lane.arrivals_s * lane.service_s for lane in lanes
               if lane.budget_s is not None) + sum(lane.queued_s for lane in lanes) / wait_s


@dataclass(frozen=True)
class Scale:
    """A pool's ``wanted`` workers and the state of its scale-down hysteresis."""

    wanted: int = 0
    low_since: float | None = None  # since when the need has stayed under ``wanted``
    #: The most needed over the last window: (time, workers) pairs, the workers falling
    #: (a sliding maximum: the first is the window's most).
    lows: tuple[tuple[float, int], ...] = ()


def down_step(noise: float) -> int:
    """The smallest scale-down worth taking: :data:`NOISE_Z` standard deviations of the
    need (``noise``, in workers), at least one worker. A step of a fixed share of the
    pool would be many deviations wide in a large pool (a fall followed late) and less
    than one in a small one (noise followed)."""
    return max(1, math.ceil(NOISE_Z * noise - 1e-9))


def next_scale(state: Scale, need: float, hold: float, now: float, down_after_s: float,
               least: int = 0, most: int = MOST_SERVERS, noise: float = 0.0,
               floor: float = 0.0) -> Scale:
    """Fold one round's needs (workers, :func:`needed`, :func:`planned`) into the pool's
    scale: ``need`` at the rate as it rises (:meth:`Rate.ahead`), ``hold`` at the rate it
    settled at (:meth:`Rate.level`).

    Up at once, when ``need`` passes ``wanted``, to the larger of the two (each is past
    its noise already: no headroom is added). Down once the need stayed under ``wanted``
    for ``down_after_s``: to the most needed over the last ``down_after_s`` (a sliding
    window, as the Kubernetes HPA's stabilization window), and on, round after round, as
    that most falls; only by a :func:`down_step` of ``noise``, and never below ``floor``
    (the load the pool serves: below it, the backlog it leaves would soon ask for the
    workers back). ``wanted`` stays within ``least..most``.
    """
    target = min(most, max(least, math.ceil(max(need, hold) - 1e-9)))
    if target > state.wanted and (need > state.wanted or state.wanted < least):
        return Scale(wanted=target)
    if state.wanted > most:
        return Scale(wanted=most)
    if target >= state.wanted:
        return Scale(wanted=state.wanted)
    since = now if state.low_since is None else state.low_since
    lows = [low for low in state.lows if low[1] > target and low[0] >= now - down_after_s]
    lows.append((now, target))
    lowest = max(lows[0][1], min(most, math.ceil(floor - 1e-9)))
    if now - since >= down_after_s and state.wanted - lowest >= down_step(noise):
        return Scale(lowest, since, tuple(lows))
    return Scale(state.wanted, since, tuple(lows))


@dataclass(frozen=True)
class Rate:
    """A rate (jobs/s) measured in rounds: a quick and a slow moving average."""

    quick: float = 0.0
    slow: float = 0.0

    def observed(self, rate: float, span_s: float) -> "Rate":
        """This rate after ``rate`` was measured over ``span_s`` seconds."""
        if span_s <= 0:
            return self
        quick = self.quick + (1 - math.exp(-span_s / QUICK_S)) * (rate - self.quick)
        slow = self.slow + (1 - math.exp(-span_s / SLOW_S)) * (rate - self.slow)
        return Rate(quick, slow)

    def ahead(self, horizon_s: float) -> float:
        """The rate expected ``horizon_s`` from now, less its noise: the quick average,
        and while it rises past the noise, its slope over its own lag and the horizon
        (a fall is waited out, not foreseen)."""
        noise = _noise(self.quick, QUICK_S)
        rise = self.quick - self.slow
        rising = rise > NOISE_Z * math.hypot(noise, _noise(self.slow, SLOW_S))
        slope = rise / (SLOW_S - QUICK_S) if rising else 0.0
        return max(0.0, self.quick - NOISE_Z * noise) + slope * (QUICK_S + horizon_s)

    def level(self) -> float:
        """The rate it settled at, and its noise: the slow average, plus
        :data:`NOISE_Z` of its deviations."""
        return self.slow + NOISE_Z * _noise(self.slow, SLOW_S)


@dataclass(frozen=True)
class LaneMeasure:
    """What one round measured of a lane in a pool."""

    busy: float  # the pool's workers busy on the lane's jobs, on average since last round
    service_s: float  # mean seconds a job holds a worker
    queued: float  # jobs waiting now
    queued_job_s: float | None = None  # mean seconds of a waiting job (None: service_s)


def scale_round(old: Mapping[str, Any], measures: Mapping[str, LaneMeasure],
                budgets_s: Mapping[str, float], within: Mapping[str, float], slots: float,
                warm_s: float, now: float, down_after_s: float,
                least: int = 0, most: int = MOST_SERVERS) -> dict[str, Any]:
    """A pool's scale after a round, from ``old`` (what the last round returned, or {}):
    each lane's arrivals (the jobs its workers served, busy over service time, plus the
    growth of its queue) folded into a :class:`Rate`; then, in workers of ``slots`` jobs
    each, the need at the rate foreseen ``warm_s`` ahead, the need at the settled rate,
    the planned backlog of the lanes with no budget (:func:`planned`, the budgeted
    lanes' work as it rises or as it settled, whichever is more: the work that may wait
    is followed through its backlog, not foreseen), the load (every lane at its slow
    average) and its noise; then :func:`next_scale`, its floor the load
    plus one deviation and one worker (a small pool's load lies between whole workers:
    without it, a dip of the average would take it below the load, and the backlog
    would soon ask the worker back); under one worker of load, the load twice over,
    so that a pool with no load left may go to zero.

    Once the backlog asks for more than ``wanted``, it waits as long as planned: the
    need is then at least the load, so that it stops growing (at once, rather than a
    worker at a time as it grows on). ``measures`` in priority order."""
    span_s = now - old["at"] if old.get("at") else 0.0
    rates, queued, rising, settled, mean, spread = {}, {}, [], [], [], 0.0
    for lane, measure in measures.items():
        queued[lane] = measure.queued
        before = old.get("queued", {}).get(lane, measure.queued)
        grown = (measure.queued - before) / span_s if span_s > 0 else 0.0
        served = measure.busy / measure.service_s
        rate = Rate(*old.get("rates", {}).get(lane, (0.0, 0.0))).observed(
            max(0.0, served + grown), span_s)
        rates[lane] = [round(rate.quick, 4), round(rate.slow, 4)]
        work_s = measure.queued * (measure.queued_job_s or measure.service_s)
        budget_s, share = budgets_s.get(lane), within.get(lane, 0.95)
        rising.append(LaneDemand(rate.ahead(warm_s), measure.service_s, work_s, budget_s,
                                 share))
        level = rate.slow if budget_s is None else rate.level()
        settled.append(LaneDemand(level, measure.service_s, work_s, budget_s, share))
        mean.append(LaneDemand(rate.slow, measure.service_s, work_s, budget_s, share))
        spread += (_noise(rate.slow, SLOW_S) * measure.service_s) ** 2
    noise = math.sqrt(spread) / slots
    load = sum(demand.arrivals_s * demand.service_s for demand in mean) / slots
    backlog = max(planned(rising), planned(mean)) / slots
    need = max(needed(rising, plan_backlog=True) / slots, backlog)
    if backlog > old.get("wanted", 0):
        need = max(need, load)
    hold = max(needed(settled, plan_backlog=True), planned(mean)) / slots
    state = Scale(old.get("wanted", 0), old.get("low_since"),
                  tuple((at, n) for at, n in old.get("lows", ())))
    # below a whole worker of load, the margins shrink with it: an idle pool may go to 0
    floor = load + min(noise, load) + min(1.0, load)
    scale = next_scale(state, need, hold, now, down_after_s, least, most, noise, floor)
    return {**asdict(scale), "need": round(need, 3), "hold": round(hold, 3), "at": now,
            "rates": rates, "queued": {lane: round(n, 2) for lane, n in queued.items()}}
