"""From heartbeat replies and lane depths to the load snapshot and lane policy (pure)."""
from __future__ import annotations

from statistics import mean
from typing import Any, Mapping

from routing.names import LANES
from routing.placement import serving
from routing.policy import Hysteresis, admitted_wait, expected_waits, free_slots, next_state

#: (model, cost, how many queued jobs it stands for) of one sampled job (``beat.costs``).
QueuedJob = tuple[str, float, float]


class Sums:
    """Workers' figures per lane (``lane_loads``, ``beat.scaling``): the sums of their
    service times and how many measured one, of their jobs in flight and busy slots,
    how many serve each lane, their job slots, and their cost lines per model."""

    def __init__(self) -> None:
        self.service_ms = dict.fromkeys(LANES, 0.0)
        self.measured = dict.fromkeys(LANES, 0)
        self.in_flight = dict.fromkeys(LANES, 0)
        self.busy = dict.fromkeys(LANES, 0.0)
        self.workers = dict.fromkeys(LANES, 0)
        self.slots = 0  # jobs the pool runs at once
        #: per model: sums of (base, per unit of cost) seconds, and how many measured it
        self.prices: dict[str, list] = {}

    def add(self, other: Sums, sign: int = 1) -> None:
        """Add ``other``'s figures (``sign`` -1: take them away)."""
        self.slots += sign * other.slots
        for lane in LANES:
            self.service_ms[lane] += sign * other.service_ms[lane]
            self.measured[lane] += sign * other.measured[lane]
            self.in_flight[lane] += sign * other.in_flight[lane]
            self.busy[lane] += sign * other.busy[lane]
            self.workers[lane] += sign * other.workers[lane]
        for model, (base_s, unit_s, count) in other.prices.items():
            found = self.prices.setdefault(model, [0.0, 0.0, 0])
            found[0] += sign * base_s
            found[1] += sign * unit_s
            found[2] += sign * count
            if not found[2]:
                del self.prices[model]


def lane_sums(healthy: list[dict]) -> Sums:
    """The figures of ``healthy`` workers per lane, added up in one pass."""
    sums = Sums()
    for worker in healthy:
        sums.slots += worker.get("concurrency", 1)
        service_ms, in_flight = worker.get("service_ms") or {}, worker.get("in_flight") or {}
        busy, lanes = worker.get("busy") or {}, worker.get("lanes", LANES)
        for lane in LANES:
            if service_ms.get(lane):
                sums.service_ms[lane] += service_ms[lane]
                sums.measured[lane] += 1
            sums.in_flight[lane] += in_flight.get(lane, 0)
            sums.busy[lane] += busy.get(lane, 0.0)
            sums.workers[lane] += lane in lanes
        for model, (base_s, unit_s) in _lines_s(worker).items():
            found = sums.prices.setdefault(model, [0.0, 0.0, 0])
            found[0] += base_s
            found[1] += unit_s
            found[2] += 1
    return sums


def _lines_s(worker: Mapping[str, Any]) -> dict[str, tuple[float, float]]:
    """Per model, the (base, per unit of cost) seconds ``worker`` measured
    (``gpu_worker.costfit``); a malformed reply prices nothing."""
    lines = {}
    for model, line in (worker.get("cost_ms") or {}).items():
        try:
            base_ms, unit_ms = map(float, line)
        except (TypeError, ValueError):
            continue
        lines[model] = (base_ms / 1000, unit_ms / 1000)
    return lines


def _queued_job_s(sample: list[QueuedJob], prices_s: Mapping[str, tuple[float, float]],
                  service_s: float) -> float:
    """Mean seconds of a lane's queued job: each sampled job priced by its model's line
    in its cost, weighed by the jobs it stands for; a job of a model no worker measured
    yet, or no sample: the lane's service time."""
    weight = sum(w for _, _, w in sample)
    if not weight:
        return service_s
    return sum(w * (prices_s[model][0] + cost * prices_s[model][1] if model in prices_s
                    else service_s) for model, cost, w in sample) / weight


def lane_loads(workers: Mapping[str, dict], depths: Mapping[str, int],
               default_service_s: float,
               queued: Mapping[str, list[QueuedJob]] | None = None,
               admit_wait_s: Mapping[str, float] | None = None,
               sums: Sums | None = None) -> dict[str, dict[str, Any]]:
    """Per lane: depth, in-flight jobs, serving workers, service time, busy slots,
    expected wait; and for each lane of ``admit_wait_s`` its admission.

    ``queued``: a sample of each lane's queued jobs (``beat.costs``), so that the
    wait counts what they cost rather than how many there are. A dead or sick
    worker adds no capacity (and its jobs in flight are its own business: they
    finish or are retried elsewhere). ``busy``: the job slots the lane's jobs hold on
    average (``beat.record.busy_slots``), which the lanes below it do not get.
    ``admit_s``: the queued work (job-slot seconds, ``routing.policy.over_budget``)
    past which a job entering the lane would wait longer than ``admit_wait_s``; each
    publish checks it on the live depths. ``sums``: the serving workers' figures as beat
    keeps them (``beat.tally``); else added up here."""
    if sums is None:
        sums = lane_sums([w for w in workers.values() if serving(w)])
    measured = {lane: sums.service_ms[lane] / sums.measured[lane] / 1000
                if sums.measured[lane] else None for lane in LANES}
    known = [s for s in measured.values() if s is not None]
    fallback = mean(known) if known else default_service_s
    service_s = {lane: measured[lane] or fallback for lane in LANES}
    prices_s = {model: (base / n, unit / n) for model, (base, unit, n) in sums.prices.items()}
    job_s = {lane: _queued_job_s((queued or {}).get(lane, []), prices_s, service_s[lane])
             for lane in LANES}
    in_flight, busy, slots = sums.in_flight, sums.busy, sums.slots
    running_s = mean(service_s.values())
    waits = expected_waits(depths, job_s, sum(in_flight.values()), slots, running_s, busy)
    loads = {lane: {"depth": depths.get(lane, 0), "in_flight": in_flight[lane],
                    "workers": sums.workers[lane],
                    "service_s": round(service_s[lane], 4),
                    "queued_job_s": round(job_s[lane], 4),
                    "busy": round(busy[lane], 3),
                    "expected_wait_s": round(waits[lane], 3)} for lane in LANES}
    free, running_work_s = free_slots(slots, busy), sum(in_flight.values()) * running_s / 2
    for lane, target_s in (admit_wait_s or {}).items():
        above = {up: (busy[up], job_s[up]) for up in LANES[:LANES.index(lane)]}
        wait_s = admitted_wait(target_s, above, free[lane])
        loads[lane].update(admit_s=round(max(0.0, wait_s * free[lane] - running_work_s), 4),
                           admit_wait_s=round(wait_s, 4))
    return loads


def next_policy(previous: Mapping[str, dict], loads: Mapping[str, dict],
                budgets_s: Mapping[str, float], release_ratio: float,
                release_samples: int) -> dict[str, dict[str, Any]]:
    """Each budgeted lane's hysteresis state after this sample.

    With no healthy worker serving a lane there is nothing to measure (and
    moving work down would not help), so its state is kept as it was.
    """
    policy = {}
    for lane in budgets_s:
        state = Hysteresis(**previous.get(lane, {"overloaded": False, "calm_samples": 0}))
        if loads[lane].get("workers", 1):
            state = next_state(state, loads[lane]["expected_wait_s"], budgets_s[lane],
                               release_ratio, release_samples)
        policy[lane] = {"overloaded": state.overloaded, "calm_samples": state.calm_samples}
    return policy
