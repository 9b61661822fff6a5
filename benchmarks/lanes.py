"""How long a fast job waits behind a backlog of relaxed jobs: gpulanes vs plain Celery.

``python benchmarks/lanes.py`` (or ``make bench``) starts an embedded Redis and on it
ONE gpulanes worker (CPU, no beat) and ONE plain Celery worker
(``benchmarks/plain_app.py``, its own process, in a Redis database of its own), and
runs, for each backlog size and repeat, the same experiment in three modes,
interleaved so that machine noise hits all alike:

1. a *blocker* job occupies the worker; we wait until it is STARTED. It holds
   at a gate (a file it polls for) so the backlog really queues however long
   publishing takes; once open, it does the same work as every other job;
2. ``backlog`` relaxed jobs are published, then one fast job; the gate opens;
3. we wait for every job and read the fast job's ``queued_ms`` (submit to
   start, stamped by the worker) and its position in start order.

*gpulanes*: ``submit(..., tier=...)``, so the fast job goes to the fast lane,
which the worker always reads first. The two plain modes run on a default Celery
app as a careful plain user writes it (kombu's stock Redis transport, Celery's stock
result backend, late acks, prefetch 1, JSON; its worker ``--pool threads -c 1 -E -Q
fast,standard,relaxed`` with ``queue_order_strategy="priority"``), running the same
demo model at the same size, its jobs published by ``apply_async`` from a process of
its own that never imports gpulanes' client, app or transport
(``benchmarks.plain_run``). *plain Celery FIFO*: every job in arrival order to one
queue (``standard``), what plain Celery with a single default queue does. *plain
Celery lanes*: each job to its tier's queue, which that worker reads in order.

Reading the table: the FIFO wait grows with the backlog (about backlog x the
per-job service time); the gpulanes wait, and the plain lanes one, stays at about
one in-flight job (the blocker) plus Redis round trips, whatever the backlog.
``position`` is the fast job's place in start order after the blocker (0 = next).
``run ms`` is the model time of one job; ``service ms`` is start-to-start time of
consecutive jobs, model time plus Celery/Redis overhead, per side (plain /
gpulanes). One unrecorded warm-up trial per mode runs first.
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

if not __package__:  # run as a script: make the project importable
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from benchmarks.common import (  # noqa: E402
    PROMPT,
    JobSize,
    check_size,
    json_option,
    markdown_table,
    run_private,
    write_json,
)
from benchmarks.lanes_trial import Send, plain_trial, trial  # noqa: E402
from benchmarks.plain_run import PlainClient, PlainWorkers, plain_env, plain_url  # noqa: E402

MODES = ("fifo", "plain_lanes", "gpulanes")
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
def gpulanes_send(size: JobSize) -> Send:
    """gpulanes' publish: ``submit()``; a gated job runs the gate model."""
    from tasks.api import submit

    def send(tier: str, seed: int, gate: Path | None) -> Any:
        model, prompt = (GATE_MODEL, f"held at gate {gate.name}") if gate else ("demo", PROMPT)
        return submit(prompt, tier=tier, account=ACCOUNT, model=model, seed=seed,
                      steps=size.steps, width=size.size, height=size.size)
    return send


def one_trial(plain: PlainClient, mode: str, backlog: int, size: JobSize,
              gate_dir: Path) -> dict[str, Any]:
    """``mode``'s trial: the plain ones in the plain publisher's process."""
    if mode == "gpulanes":
        return trial(gpulanes_send(size), mode, backlog, gate_dir)
    return plain.call(plain_trial, mode, backlog, size, gate_dir)


def run_all(plain: PlainClient, backlogs: list[int], repeats: int, size: JobSize,
            gate_dir: Path) -> list[dict]:
    """Every (repeat, backlog), every mode back to back; the order alternates."""
    for mode in MODES:  # warm-up, not recorded: first connections, first queue reads
        one_trial(plain, mode, 0, size, gate_dir)
    trials = []
    for repeat in range(repeats):
        for backlog in backlogs:
            order = MODES if (repeat + backlog) % 2 == 0 else MODES[::-1]
            for mode in order:
                result = {**one_trial(plain, mode, backlog, size, gate_dir),
                          "repeat": repeat}
                trials.append(result)
                print(f"  repeat {repeat} backlog {backlog:>4} {mode:<8} fast job waited "
                      f"{result['fast_wait_ms']:8.1f} ms, started "
                      f"#{result['fast_position']}", file=sys.stderr, flush=True)
    return trials


def median_of(rows: list[dict], key: str) -> float | None:
    """The median of ``key`` over ``rows``, skipping None; None when nothing is left."""
    values = [r[key] for r in rows if r[key] is not None]
    return statistics.median(values) if values else None


def side_of(mode: str) -> str:
    """Whose worker ran ``mode``'s jobs."""
    return "gpulanes" if mode == "gpulanes" else "plain"


def summary(trials: list[dict], backlogs: list[int]) -> list[dict[str, Any]]:
    """Medians per (mode, backlog), one row per backlog; run and service times per side."""
    rows = []
    for backlog in backlogs:
        row: dict[str, Any] = {"backlog": backlog}
        for mode in MODES:
            mine = [t for t in trials if t["mode"] == mode and t["backlog"] == backlog]
            row[f"{mode}_wait_ms"] = median_of(mine, "fast_wait_ms")
            row[f"{mode}_position"] = median_of(mine, "fast_position")
            row[f"{mode}_lanes"] = sorted({t["fast_lane"] for t in mine})
        for side in ("plain", "gpulanes"):
            same = [t for t in trials if t["backlog"] == backlog and side_of(t["mode"]) == side]
            row[f"{side}_run_ms"] = statistics.fmean(t["run_ms"] for t in same)
            row[f"{side}_service_ms"] = median_of(same, "service_ms")
        row["ratio"] = row["fifo_wait_ms"] / max(row["gpulanes_wait_ms"], 1e-3)
        row["lanes_ratio"] = row["plain_lanes_wait_ms"] / max(row["gpulanes_wait_ms"], 1e-3)
        rows.append(row)
    return rows


def ms(value: float | None) -> str:
    """A table cell in ms, "-" for none."""
    return "-" if value is None else f"{value:.1f}"


def table(rows: list[dict[str, Any]]) -> str:
    """The markdown table printed at the end."""
    return markdown_table(
        ["backlog", "plain Celery FIFO wait (ms, median)", "plain Celery lanes wait (ms)",
         "gpulanes wait (ms)", "ratio FIFO/gpulanes", "ratio plain lanes/gpulanes",
         "fast job position (FIFO / plain lanes / gpulanes)",
         "mean job run ms (plain / gpulanes)", "service ms/job (plain / gpulanes)"],
        [[r["backlog"], ms(r["fifo_wait_ms"]), ms(r["plain_lanes_wait_ms"]),
          ms(r["gpulanes_wait_ms"]), f"{r['ratio']:.1f}x", f"{r['lanes_ratio']:.2f}x",
          " / ".join(f"{r[f'{mode}_position']:g}" for mode in MODES),
          f"{ms(r['plain_run_ms'])} / {ms(r['gpulanes_run_ms'])}",
          f"{ms(r['plain_service_ms'])} / {ms(r['gpulanes_service_ms'])}"]
         for r in rows], align="r" * 9)


def verdict(rows: list[dict[str, Any]]) -> str:
    """One line on the project's goal, stated for the largest backlog measured."""
    last = rows[-1]
    met = "met" if last["ratio"] >= GOAL_RATIO else "NOT met"
    lanes = ", ".join(f"{last[f'{mode}_lanes']} ({mode})" for mode in MODES)
    return (f"At a {last['backlog']}-job backlog the fast job waits {last['ratio']:.1f}x less "
            f"with gpulanes than plain FIFO (goal >= {GOAL_RATIO:g}x: {met}), and "
            f"{last['lanes_ratio']:.2f}x as long with plain Celery lanes as with gpulanes; "
            f"fast job ran in {lanes}.")


def benchmark(args: argparse.Namespace, state: Path) -> dict[str, Any]:
    """Start both workers, run every trial, stop them; the JSON report."""
    from tasks import app
    from tasks.dev.cluster import LocalCluster

    size = JobSize(args.steps, args.size)
    check_size("lanes.py", size, ACCOUNT)
    (state / "gates").mkdir(parents=True, exist_ok=True)
    cluster = LocalCluster(state, workers=1, device="cpu", beat=False, log_dir=state / "logs")
    try:
        print("starting embedded Redis, one gpulanes and one plain worker (cpu) ...",
              file=sys.stderr, flush=True)
        cluster.start(app)
        env = plain_env(plain_url(cluster.url), state)
        with PlainWorkers(1, env, state / "logs"), PlainClient(env) as plain:
            trials = run_all(plain, args.backlogs, args.repeats, size, state / "gates")
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
    json_option(parser, "lanes")
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
          f"one CPU worker per side; total wall time {report['wall_s']:.1f}s")
    write_json(args.json, report)
    return 0


if __name__ == "__main__":
    sys.exit(main())
