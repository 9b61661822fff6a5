"""How long a fast job waits behind a backlog of relaxed jobs: gpulanes vs plain Celery.

``python benchmarks/lanes.py`` (or ``make bench``) starts one local cluster (an
embedded Redis and ONE worker, CPU, no beat) and runs, for each backlog size
and repeat, the same experiment in two modes, interleaved so that machine
noise hits both alike:

1. a *blocker* job occupies the worker; we wait until it is STARTED. It holds
   at a gate (a file it polls for) so the backlog really queues however long
   publishing takes; once open, it does the same work as every other job;
2. ``backlog`` relaxed jobs are published, then one fast job; the gate opens;
3. we wait for every job and read the fast job's ``queued_ms`` (submit to
   start, stamped by the worker) and its position in start order.

*gpulanes*: ``submit(..., tier=...)``, so the fast job goes to the fast lane,
which the worker always reads first. *plain Celery FIFO*: the same jobs,
published in arrival order to one queue (``standard``), which is what plain
Celery with a single default queue does.

Reading the table: the FIFO wait grows with the backlog (about backlog x the
per-job service time); the gpulanes wait stays at about one in-flight job (the
blocker) plus Redis round trips, whatever the backlog. ``position`` is the
fast job's place in start order after the blocker (0 = next). ``run ms`` is
the model time of one job; ``service ms`` is start-to-start time of
consecutive jobs, model time plus Celery/Redis overhead. One unrecorded
warm-up trial per mode runs first.
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time
import uuid
from dataclasses import asdict
from pathlib import Path
from typing import Any

if not __package__:  # run as a script: make the project importable
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from benchmarks.common import (  # noqa: E402
    PROMPT,
    JobSize,
    check_size,
    markdown_table,
    plain_kwargs,
    run_private,
    write_json,
)

MODES = ("fifo", "gpulanes")
FIFO_QUEUE = "standard"
GATE_MODEL = "gate"
GATE_TIMEOUT_S = 60.0
ACCOUNT = "bench"
GOAL_RATIO = 20.0
MODELS = f"demo=gpu_worker.demo_model:load,{GATE_MODEL}=benchmarks.lanes:load_gate"


# --- worker side: the gated blocker model ------------------------------------
class GatedModel:
    """The demo model, but ``generate`` first waits for ``<gate_dir>/<last word of prompt>``."""

    def __init__(self, name: str, inner: Any, gate_dir: Path) -> None:
        self.name, self.device, self.inner, self.gate_dir = name, inner.device, inner, gate_dir

    def warmup(self) -> None:
        self.inner.warmup()

    def generate(self, prompt: str, *, seed: int, steps: int, width: int, height: int,
                 on_step: Any = None) -> Any:
        """Wait for this prompt's gate (at most ``GATE_TIMEOUT_S``), then generate."""
        gate = self.gate_dir / prompt.split()[-1]
        deadline = time.monotonic() + GATE_TIMEOUT_S  # never hang the worker for good
        while not gate.exists() and time.monotonic() < deadline:
            time.sleep(0.0005)
        return self.inner.generate(prompt, seed=seed, steps=steps, width=width,
                                   height=height, on_step=on_step)


def load_gate(*, name: str, device: str, model_dir: Path) -> GatedModel:
    """Model factory for ``GPULANES_MODELS`` (imported by the worker)."""
    from gpu_worker.demo_model import load
    from tasks.settings import settings

    return GatedModel(name, load(name="demo", device=device, model_dir=model_dir),
                      Path(settings.state_dir) / "gates")


# --- client side ---------------------------------------------------------------
def send(mode: str, tier: str, size: JobSize, seed: int, *, model: str = "demo",
         prompt: str = PROMPT) -> Any:
    """Publish one job: through gpulanes' ``submit``, or to the one FIFO queue."""
    from tasks.api import submit
    from tasks.worker.generate import generate

    if mode == "gpulanes":
        return submit(prompt, tier=tier, account=ACCOUNT, model=model, seed=seed,
                      steps=size.steps, width=size.size, height=size.size)
    return generate.apply_async(kwargs=plain_kwargs(prompt, tier, ACCOUNT, seed, size, model),
                                queue=FIFO_QUEUE, task_id=str(uuid.uuid4()))


def wait_started(result: Any, timeout_s: float = 60.0) -> None:
    """Block until the worker has picked ``result``'s job up."""
    deadline = time.monotonic() + timeout_s
    while result.state not in ("STARTED", "SUCCESS"):
        if result.state in ("FAILURE", "REVOKED") or time.monotonic() > deadline:
            raise RuntimeError(f"blocker job {result.id} did not start: {result.state}")
        time.sleep(0.002)


def start_blocker(mode: str, size: JobSize, gate: Path) -> Any:
    """Occupy the worker with a job held until ``gate`` exists; return it once STARTED."""
    blocker = send(mode, "relaxed", size, seed=0, model=GATE_MODEL,
                   prompt=f"held at gate {gate.name}")
    wait_started(blocker)
    return blocker


def trial(mode: str, backlog: int, size: JobSize, gate_dir: Path) -> dict[str, Any]:
    """One run of the experiment; the fast job's wait and position in start order."""
    from celery.result import ResultSet

    gate = gate_dir / uuid.uuid4().hex
    try:
        blocker = start_blocker(mode, size, gate)
        jobs = [send(mode, "relaxed", size, seed=i + 1) for i in range(backlog)]
        fast = send(mode, "fast", size, seed=backlog + 1)
    finally:
        gate.touch()  # also on error or Ctrl-C, so the worker can stop
    done = ResultSet([blocker, *jobs, fast]).get(timeout=300 + backlog)
    return summarize(mode, backlog, done)


def summarize(mode: str, backlog: int, done: list[dict]) -> dict[str, Any]:
    """Reduce one trial's result dicts (blocker first, fast job last) to its figures."""
    fast, after_blocker = done[-1], sorted(done[1:], key=lambda r: r["started_at"])
    starts = [r["started_at"] for r in after_blocker]
    service_ms = ((starts[-1] - starts[0]) * 1000 / (len(starts) - 1)
                  if len(starts) > 1 else None)
    return {
        "mode": mode, "backlog": backlog, "fast_wait_ms": fast["queued_ms"],
        "fast_position": [r["job_id"] for r in after_blocker].index(fast["job_id"]),
        "fast_lane": fast["lane"], "service_ms": service_ms,
        "run_ms": statistics.fmean(r["run_ms"] for r in done[1:]),
    }


def run_all(backlogs: list[int], repeats: int, size: JobSize, gate_dir: Path) -> list[dict]:
    """Every (repeat, backlog), both modes back to back; who goes first alternates."""
    for mode in MODES:  # warm-up, not recorded: first connections, first queue reads
        trial(mode, 0, size, gate_dir)
    trials = []
    for repeat in range(repeats):
        for backlog in backlogs:
            order = MODES if (repeat + backlog) % 2 == 0 else MODES[::-1]
            for mode in order:
                result = {**trial(mode, backlog, size, gate_dir), "repeat": repeat}
                trials.append(result)
                print(f"  repeat {repeat} backlog {backlog:>4} {mode:<8} fast job waited "
                      f"{result['fast_wait_ms']:8.1f} ms, started "
                      f"#{result['fast_position']}", file=sys.stderr, flush=True)
    return trials


def median_of(rows: list[dict], key: str) -> float | None:
    """The median of ``key`` over ``rows``, skipping None; None when nothing is left."""
    values = [r[key] for r in rows if r[key] is not None]
    return statistics.median(values) if values else None


def summary(trials: list[dict], backlogs: list[int]) -> list[dict[str, Any]]:
    """Medians per (mode, backlog), one row per backlog."""
    rows = []
    for backlog in backlogs:
        row: dict[str, Any] = {"backlog": backlog}
        for mode in MODES:
            mine = [t for t in trials if t["mode"] == mode and t["backlog"] == backlog]
            row[f"{mode}_wait_ms"] = median_of(mine, "fast_wait_ms")
            row[f"{mode}_position"] = median_of(mine, "fast_position")
            row[f"{mode}_lanes"] = sorted({t["fast_lane"] for t in mine})
        same = [t for t in trials if t["backlog"] == backlog]
        row["run_ms"] = statistics.fmean(t["run_ms"] for t in same)
        row["service_ms"] = median_of(same, "service_ms")
        row["ratio"] = row["fifo_wait_ms"] / max(row["gpulanes_wait_ms"], 1e-3)
        rows.append(row)
    return rows


def table(rows: list[dict[str, Any]]) -> str:
    """The markdown table printed at the end."""
    return markdown_table(
        ["backlog", "plain Celery FIFO wait (ms, median)", "gpulanes wait (ms, median)",
         "ratio FIFO/gpulanes", "fast job position (FIFO / gpulanes)", "mean job run ms",
         "service ms/job"],
        [[r["backlog"], f"{r['fifo_wait_ms']:.1f}", f"{r['gpulanes_wait_ms']:.1f}",
          f"{r['ratio']:.1f}x", f"{r['fifo_position']:g} / {r['gpulanes_position']:g}",
          f"{r['run_ms']:.1f}", "-" if r["service_ms"] is None else f"{r['service_ms']:.1f}"]
         for r in rows], align="r" * 7)


def verdict(rows: list[dict[str, Any]]) -> str:
    """One line on the project's goal, stated for the largest backlog measured."""
    last = rows[-1]
    met = "met" if last["ratio"] >= GOAL_RATIO else "NOT met"
    lanes = f"fast job ran in {last['gpulanes_lanes']} (gpulanes), {last['fifo_lanes']} (FIFO)"
    return (f"At a {last['backlog']}-job backlog the fast job waits {last['ratio']:.1f}x less "
            f"with gpulanes (goal >= {GOAL_RATIO:g}x: {met}); {lanes}.")


def benchmark(args: argparse.Namespace, state: Path) -> dict[str, Any]:
    """Start the cluster, run every trial, stop the cluster; the JSON report."""
    from tasks import app
    from tasks.dev.cluster import LocalCluster

    size = JobSize(args.steps, args.size)
    check_size("lanes.py", size, ACCOUNT)
    (state / "gates").mkdir(parents=True, exist_ok=True)
    cluster = LocalCluster(state, workers=1, device="cpu", beat=False, log_dir=state / "logs")
    try:
        print("starting embedded Redis and one worker (cpu) ...", file=sys.stderr, flush=True)
        cluster.start(app)
        trials = run_all(args.backlogs, args.repeats, size, state / "gates")
    finally:
        cluster.stop()
    return {"config": {"backlogs": args.backlogs, "repeats": args.repeats, **asdict(size),
                       "workers": 1, "device": "cpu"},
            "summary": summary(trials, args.backlogs), "trials": trials}


def backlog_sizes(raw: str) -> list[int]:
    """``"0,50,200"`` -> ``[0, 50, 200]`` (sorted, without duplicates)."""
    return sorted({int(item) for item in raw.split(",") if item.strip()})


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """The command line; backlogs non-negative, at least one repeat."""
    parser = argparse.ArgumentParser(prog="python benchmarks/lanes.py", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--backlogs", default="0,25,50,100,200",
                        type=backlog_sizes,
                        help="relaxed jobs queued ahead of the fast one (default: %(default)s)")
    parser.add_argument("--repeats", type=int, default=3, help="runs per (mode, backlog)")
    parser.add_argument("--steps", type=int, default=4, help="denoising steps per job")
    parser.add_argument("--size", type=int, default=64, help="image side in pixels")
    parser.add_argument("--json", type=Path, metavar="PATH", help="also write results here")
    args = parser.parse_args(argv)
    if args.repeats < 1 or not args.backlogs or min(args.backlogs) < 0:
        parser.error("--repeats must be >= 1 and --backlogs non-negative integers")
    return args


def main(argv: list[str] | None = None) -> int:
    """Run the benchmark, print the table and the verdict; 130 after Ctrl-C."""
    args = parse_args(argv)
    report = run_private("gl-bench-", lambda state: benchmark(args, state),
                         "the cluster is stopped", MODELS=MODELS, WARM_MODELS=f"demo,{GATE_MODEL}")
    if report is None:
        return 130
    print(table(report["summary"]))
    print(verdict(report["summary"]))
    print(f"{args.steps} steps at {args.size}x{args.size}, {args.repeats} repeat(s), "
          f"one CPU worker; total wall time {report['wall_s']:.1f}s")
    write_json(args.json, report)
    return 0


if __name__ == "__main__":
    sys.exit(main())
