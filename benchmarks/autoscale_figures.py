"""The live autoscaling check's loop rule and figures (pure: ``benchmarks/autoscale.py``
runs the cluster)."""
from __future__ import annotations

import argparse
from dataclasses import asdict, dataclass
from typing import Any, Iterable

from benchmarks.common import markdown_table, percentile

#: The standard lane's wait budget (GPULANES_MAX_WAIT_S's default).
BUDGET_S = 60.0


@dataclass(frozen=True)
class Sample:
    """One poll of the loop: beat's scale of the pool, and the supervisors running."""

    at: float  # unix time
    wanted: int
    current: int  # workers beat counts in the pool
    replicas: int  # supervisors the loop runs (started, not stopped)
    need: float  # workers needed at the rate foreseen (beat)
    hold: float = 0.0  # workers needed at the rate settled (beat)


def follow(wanted: int, least: int, most: int) -> int:
    """The supervisors to run for beat's ``wanted``: as KEDA and the HPA follow a
    metric of AverageValue 1, within the replica limits."""
    return min(most, max(least, int(wanted)))


def waits(outs: Iterable[dict[str, Any]], since: float, until: float) -> dict[str, Any]:
    """The waits of the jobs submitted in ``since..until`` (unix times)."""
    found = [out["queued_ms"] / 1000 for out in outs
             if since <= out["started_at"] - out["queued_ms"] / 1000 < until]
    if not found:
        return {"jobs": 0}
    return {"jobs": len(found), "p50_s": round(percentile(found, 0.5), 2),
            "p95_s": round(percentile(found, 0.95), 2), "max_s": round(max(found), 2),
            "within": round(sum(w <= BUDGET_S for w in found) / len(found), 4)}


def _first(samples: list[Sample], since: float, test: Any) -> float | None:
    """Seconds from ``since`` to the first sample at or after it that passes ``test``."""
    return next((round(s.at - since, 1) for s in samples if s.at >= since and test(s)), None)


def worker_seconds(samples: list[Sample], until: float) -> float:
    """Supervisors running, integrated over the run (each held until the next poll)."""
    ends = [s.at for s in samples[1:]] + [until]
    return sum(s.replicas * (end - s.at) for s, end in zip(samples, ends))


def figures(args: argparse.Namespace, samples: list[Sample], phases: dict[str, float],
            outs: list[dict[str, Any]], counts: Any, events: list[dict[str, Any]],
            exits: dict[str, int]) -> dict[str, Any]:
    """The run's report: times to scale up, scale-downs, waits, jobs, goals."""
    step, down, end = phases["high"], phases["down"], phases["end"]
    before = max((s.wanted for s in samples if s.at < step), default=0)
    peak = max((s.wanted for s in samples if step <= s.at < down), default=0)
    enough = min(args.most, peak)
    downs = [{"after_s": round(e["at"] - down, 1), "stopped": e["stop"]}
             for e in events if "stop" in e and down <= e["at"] < end]
    at_least = [s for s in samples if s.at >= down and s.replicas <= args.least]
    fixed_s = args.most * (end - phases["low"])
    jobs = {"accepted": counts.accepted, "refused": counts.refused,
            "completed": counts.completed, "failed": counts.failed, "lost": counts.lost,
            "ran_twice_to_end": counts.duplicated, "rerun": counts.rerun,
            "handed_on": sum(bool(out.get("preempted")) for out in outs)}
    found = {
        "least": args.least, "most": args.most, "poll_s": args.poll_s,
        "rates": {"low": args.low, "high": args.high},
        "phase_s": {"low": args.low_s, "high": args.high_s, "down": round(end - down, 1)},
        "job": {"steps": args.steps, "step_ms": args.step_ms},
        "step_up": {"wanted_before": before, "peak_wanted": peak, "enough": enough,
                    "asked_s": _first(samples, step, lambda s: s.wanted > before),
                    "enough_s": _first(samples, step, lambda s: s.current >= enough)},
        "step_down": {"scale_downs": downs,
                      "back_to_least_s": round(at_least[0].at - down, 1) if at_least else None},
        "waits": {"before": waits(outs, phases["low"], step), "step": waits(outs, step, down),
                  "after": waits(outs, down, end)},
        "worker_s": round(worker_seconds(samples, end), 1),
        "fixed_fleet_s": round(fixed_s, 1),
        "jobs": jobs,
        "supervisors": {"started": sum("start" in e for e in events),
                        "stopped": sum("stop" in e for e in events),
                        "exit_codes": sorted(set(exits.values())),
                        "exit_s": [e["after_s"] for e in events if "exited" in e]},
        "phases_at": {name: round(at - phases["low"], 1) for name, at in phases.items()},
        "timeline": [asdict(s) | {"at": round(s.at - phases["low"], 1)} for s in samples],
    }
    found["worker_s_vs_fixed"] = round(found["worker_s"] / fixed_s, 3) if fixed_s else None
    found["missed"] = missed(found)
    return found


def missed(found: dict[str, Any]) -> list[str]:
    """The goals the run missed (none: it passed)."""
    jobs, said = found["jobs"], []
    if jobs["lost"] or jobs["failed"] or jobs["ran_twice_to_end"]:
        said.append(f"jobs lost {jobs['lost']}, failed {jobs['failed']}, ran twice to their "
                    f"end {jobs['ran_twice_to_end']}")
    if jobs["completed"] != jobs["accepted"]:
        said.append(f"{jobs['completed']} of {jobs['accepted']} accepted jobs completed")
    if any(code != 0 for code in found["supervisors"]["exit_codes"]):
        said.append(f"stopped supervisors exited {found['supervisors']['exit_codes']}")
    if found["step_up"]["enough_s"] is None:
        said.append("the fleet never had the workers the signal asked for")
    if found["step_down"]["back_to_least_s"] is None:
        said.append(f"the fleet was not back to {found['least']} worker(s) at the end")
    return said


def report(found: dict[str, Any]) -> None:
    up, down = found["step_up"], found["step_down"]
    print(f"step up {found['rates']['low']:g} -> {found['rates']['high']:g} jobs/s: the signal "
          f"asked for more after {up['asked_s']} s (wanted {up['wanted_before']} -> "
          f"{up['peak_wanted']}), {up['enough']} workers served after {up['enough_s']} s")
    print(f"step down: scale-downs at {[d['after_s'] for d in down['scale_downs']]} s, back to "
          f"{found['least']} after {down['back_to_least_s']} s")
    rows = [[phase, w["jobs"], w.get("p50_s"), w.get("p95_s"), w.get("max_s"), w.get("within")]
            for phase, w in found["waits"].items()]
    print(markdown_table(["jobs submitted", "jobs", "p50 wait s", "p95 wait s", "max wait s",
                          f"within {BUDGET_S:g} s"], rows))
    print(f"worker-seconds {found['worker_s']:,} = {found['worker_s_vs_fixed']}x a fixed fleet "
          f"of {found['most']}; jobs {found['jobs']}; supervisors {found['supervisors']}")
    for goal in found["missed"]:
        print(f"MISSED: {goal}")
