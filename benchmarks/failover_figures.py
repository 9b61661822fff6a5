"""What a failover run records, and the figures read from it.

:class:`TimedStream` notes every submit (when, accepted or why refused); :class:`Run`
notes the fault (which primary, when); :func:`figures` reads a scenario's report from
them, from the watcher's samples (``benchmarks/failover_watch.py``) and from the logs:
the counts of ``tests.harness.faults.settle``, the runs finished twice, the failover's
timeline, each client's connections, the beats' leads and the errors logged.
"""
from __future__ import annotations

import argparse
import re
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from benchmarks.failover_watch import (
    Operator,
    Sample,
    errors_logged,
    finished_runs,
    first,
    last,
    leaders_seen,
    leads_logged,
    lease_at_end,
    sentinel_events,
)
from benchmarks.sentinels import SentinelCluster, SentinelTopology
from tests.harness.faults import Counts, JobStream


class TimedStream(JobStream):
    """A :class:`JobStream` that notes each offer: (began, ended, accepted), wall clock,
    when each accepted job was sent, and why submits were refused (with their cause)."""

    def __init__(self) -> None:
        super().__init__()
        self.offers: list[tuple[float, float, bool]] = []
        self.sent_at: dict[str, float] = {}
        self.reasons: Counter[str] = Counter()

    def submit_one(self) -> Any | None:
        from tasks import submit

        index, self.submitted = self.submitted, self.submitted + 1
        began, job = time.time(), self.make_job(index)
        try:
            result = submit(**job)
        except Exception as exc:  # noqa: BLE001  a refusal: counted, never accepted
            self.offers.append((began, time.time(), False))
            self.refused[type(exc).__name__] += 1
            self.reasons[reason(exc)] += 1
            self.slowest_refusal_s = max(self.slowest_refusal_s, self.offers[-1][1] - began)
            return None
        self.offers.append((began, time.time(), True))
        self.accepted[result.id], self.sent_at[result.id] = result, began
        return result

    def add(self, results: list[Any], sent_at: float) -> None:
        """Count ``results`` (submitted apart from the stream) among its jobs."""
        self.accepted.update((r.id, r) for r in results)
        self.sent_at.update((r.id, sent_at) for r in results)
        self.submitted += len(results)


def reason(exc: BaseException) -> str:
    """``Name: message`` of a refusal and of its cause, numbers masked."""
    said = f"{type(exc).__name__}: {exc}"
    if exc.__cause__ is not None:
        said += f" <- {type(exc.__cause__).__name__}: {exc.__cause__}"
    return re.sub(r"\d+", "N", said)[:160]


@dataclass
class Run:
    """One scenario's fault: the primary it hit and when (monotonic and wall clock)."""

    args: argparse.Namespace
    topology: SentinelTopology
    old: int
    new: int = 0
    fault_at: float = 0.0
    fault_wall: float = 0.0
    #: When every job was counted (wall clock): the cluster's shutdown comes after.
    settled_wall: float = 0.0
    #: When (monotonic) a Sentinel switched to the new primary, and demoted the old one.
    promoted_at: float | None = None
    demoted_at: float | None = None
    notes: dict[str, Any] = field(default_factory=dict)

    def mark(self) -> None:
        """The primary is hit now."""
        self.fault_at, self.fault_wall = time.monotonic(), time.time()

    def monotonic(self, wall: float | None) -> float | None:
        """A wall-clock time of this run on the monotonic clock."""
        return None if wall is None else self.fault_at + (wall - self.fault_wall)

    def since(self, at: float | None) -> float | None:
        """Seconds from the fault to ``at`` (monotonic), to a tenth."""
        return None if at is None else round(at - self.fault_at, 1)

    def pid(self, port: int) -> int:
        """The pid of the server on ``port``."""
        return self.topology.server(port).process.pid


# --- figures -------------------------------------------------------------------------
def read_failover(run: Run) -> None:
    """When the Sentinels switched to the new primary and demoted the old, from their logs."""
    logs = list(run.topology.root.glob("sentinel-*/sentinel.log"))
    run.promoted_at = run.monotonic(sentinel_events(logs, "+switch-master", run.fault_wall))
    run.demoted_at = run.monotonic(sentinel_events(logs, "+convert-to-slave", run.fault_wall))


def figures(run: Run, name: str, stream: TimedStream, counts: Counts,
            samples: list[Sample], cluster: SentinelCluster) -> dict[str, Any]:
    """The scenario's report: its counts, its timeline, its clients, its beats, its errors."""
    finished = finished_runs(cluster.log_dir / "workers.log")
    beats = {pid: beat for beat, pid in cluster.beat_pids().items()}
    logs = [cluster.log_dir / f"{log}.log" for log in ("workers", *beats.values())]
    if "behind_since" in run.notes:
        run.notes["accepted_while_behind"] = accepted_between(
            stream, run.notes["behind_since"], run.fault_wall)
    return {"name": name, "label": counts.scenario, "old": run.old, "new": run.new,
            "notes": run.notes, "counts": vars(counts), "refusals": dict(stream.reasons),
            "ran_twice": sum(finished[job_id] >= 2 for job_id in stream.accepted),
            "lost_sent_s": sorted(round(stream.sent_at[job_id] - run.fault_wall, 1)
                                  for job_id in counts.lost_ids if job_id in stream.sent_at),
            "timeline": timeline(run, samples, stream),
            "clients": clients(run, samples),
            "beat": beat_figures(run, samples, beats, cluster.log_dir),
            "errors": dict(errors_logged(logs, run.fault_wall, run.settled_wall).most_common(15))}


def operator_figures(run: Run, operator: Operator) -> dict[str, float | None]:
    """Seconds after the fault until a ``lanes status`` begun after it first answered,
    and until the exporter answered every scrape from then on."""
    failed = [at for at, answered in operator.scrapes if not answered and at >= run.fault_at]
    back = next((at for at, answered in operator.scrapes
                 if answered and at > max(failed, default=run.fault_at)), None)
    status_ok = next((ended for began, ended, answered in operator.statuses
                      if answered and began >= run.fault_at), None)
    settled = (run.promoted_at or run.fault_at) + 1.0  # every Sentinel has heard by then
    return {"status_ok_s": run.since(status_ok),
            # a `lanes status` is a process of its own: it asks the Sentinels as it starts
            "status_failed_after_promotion": sum(
                not answered for began, _, answered in operator.statuses if began >= settled),
            "exporter_back_s": run.since(back) if failed else 0.0}


def accepted_between(stream: TimedStream, since_wall: float, until_wall: float) -> int:
    """How many submits the stream had accepted between the two times."""
    return sum(accepted and since_wall <= ended < until_wall
               for _, ended, accepted in stream.offers)


def timeline(run: Run, samples: list[Sample], stream: TimedStream) -> dict[str, float | None]:
    """Seconds after the fault until each step of the failover (None: it never came)."""
    after = run.promoted_at or run.fault_at
    leads = first(samples, lambda s: bool((s.leaders.get(run.new) or (None, 0))[0]), after)
    return {"promoted_s": run.since(run.promoted_at), "old_demoted_s": run.since(run.demoted_at),
            "submits_back_s": submits_back(stream.offers, run.fault_wall),
            "refused": refusals(stream.offers, run.fault_wall),
            "workers_ran_s": workers_ran(run, stream), "beat_leads_s": run.since(leads)}


def refusals(offers: list[tuple[float, float, bool]],
             fault_wall: float) -> list[tuple[float, float, int]]:
    """Each run of refused submits after the fault, with no acceptance between them:
    (began, ended: seconds after the fault, how many)."""
    runs: list[tuple[float, float, int]] = []
    new_run = True
    for began, ended, accepted in offers:
        if ended < fault_wall or accepted:
            new_run = True
            continue
        began_s, ended_s = round(began - fault_wall, 1), round(ended - fault_wall, 1)
        if new_run:
            runs.append((began_s, ended_s, 1))
        else:
            runs[-1] = (runs[-1][0], ended_s, runs[-1][2] + 1)
        new_run = False
    return runs


def submits_back(offers: list[tuple[float, float, bool]], fault_wall: float) -> float | None:
    """Seconds after the fault until the first submit accepted after the last refusal."""
    after = [offer for offer in offers if offer[1] >= fault_wall]
    refused = [ended for _, ended, accepted in after if not accepted]
    since = refused[-1] if refused else fault_wall
    back = next((ended for _, ended, accepted in after if accepted and ended >= since), None)
    return None if back is None else round(back - fault_wall, 1)


def workers_ran(run: Run, stream: TimedStream) -> float | None:
    """Seconds after the fault until every worker had begun a job (whose result came
    back) after the promotion; None if one never did."""
    promoted_wall = run.fault_wall + ((run.promoted_at or run.fault_at) - run.fault_at)
    began: dict[str, float] = {}
    for job_id, result in stream.accepted.items():
        if result.state != "SUCCESS" or not isinstance(result.result, dict):
            continue
        at = stream.sent_at[job_id] + result.result["queued_ms"] / 1000
        worker = str(result.result.get("worker", "?")).split("@")[0]
        if at >= promoted_wall:
            began[worker] = min(began.get(worker, at), at)
    if len(began) < run.args.workers:
        return None
    return round(max(began.values()) - run.fault_wall, 1)


def clients(run: Run, samples: list[Sample]) -> dict[str, dict[str, float | None]]:
    """Per process: when it first held a connection to the new primary, and when it
    last held one to the old (seconds after the fault)."""
    names = sorted({name for s in samples for name in s.links})
    return {name: _client(run, samples, name) for name in names}


def _client(run: Run, samples: list[Sample], name: str) -> dict[str, float | None]:
    on_new = first(samples, lambda s: run.new in s.links.get(name, ()),
                   run.promoted_at or run.fault_at)
    on_old = last(samples, lambda s: run.old in s.links.get(name, ()), run.fault_at)
    return {"on_new_s": run.since(on_new), "on_old_until_s": run.since(on_old)}


def beat_figures(run: Run, samples: list[Sample], beats: dict[int, str],
                 log_dir: Path) -> dict[str, Any]:
    """The (beat, epoch) leading before the fault, each that led on the new primary and on
    the old one after the promotion, and the leads the beats logged after the fault."""
    before = [s.leaders.get(run.old) for s in samples if s.at < run.fault_at]
    after = run.promoted_at or run.fault_at
    on_old = _leads(run, samples, run.old, after, beats) if run.promoted_at else []
    return {"before": next((found for found in reversed(before) if found), None),
            "on_new": _leads(run, samples, run.new, after, beats),
            "on_old_after": [lead for lead in on_old if lead[1] != "-"],
            "logged": sorted(lead for beat in beats.values()
                             for lead in leads_logged(log_dir / f"{beat}.log", run.fault_wall,
                                                      run.settled_wall, beats)),
            "at_end": {beat: lease_at_end(log_dir / f"{beat}.log", run.settled_wall)
                       for beat in beats.values()}}


def _leads(run: Run, samples: list[Sample], port: int, after: float,
           beats: dict[int, str]) -> list[tuple[float | None, str, int]]:
    """Each (beat, epoch) that led on the server on ``port`` while it was a primary."""
    primary = [s for s in samples if s.roles.get(port) == "master"]
    return [(run.since(at), beat, epoch)
            for at, beat, epoch in leaders_seen(primary, port, after, beats)]
