"""One worker pool driven at 2x its capacity: gpulanes against plain Celery lanes.

``python benchmarks/overload.py`` starts one local cluster (an embedded Redis,
``--workers`` CPU workers consuming ``fast,standard,relaxed`` in that order, no
beat) and then:

1. **capacity**: bursts through all three lanes of jobs of one size
   (``--steps``, ``--size``); a burst's jobs/s is the sum over workers of one
   over their start-to-start time; capacity is the best of three bursts (other
   load on the machine only lowers it); one *job-time* is ``workers / capacity``.
   The gpulanes budgets follow from it (fast 10, standard 60 job-times) and are
   printed; heartbeat 0.5 s.
2. **a trial per mode** (``--repeats`` each, the order alternating): an open
   loop offers evenly spaced jobs at 2x capacity for ``--duration`` s, by
   default 20% fast, 30% standard, 50% relaxed (``--mix``) from four accounts,
   the same seeded sequence in both modes; then it waits (at most ``--drain``
   s) for every accepted job. With the default mix fast+standard alone offer
   about 1x capacity; ``--mix 30,40,30`` makes them 1.4x, where the policy
   has real work to do.

*gpulanes*: ``submit()`` with its defaults (standard may move down, fast may
not), beat running heartbeats, the overload policy and the deadline mover;
``LaneFull`` refusals are counted apart (the caller is told). *plain*:
``generate.apply_async(kwargs=..., queue=tier)`` into the same three queues,
read in the same order by the same workers, with no policy. Beat's movers
would move plain jobs too, and budgets "too high to matter" would still leave
beat's CPU in the plain trial, so the cluster has no beat: this script starts
one (fresh snapshot, fresh hysteresis) for each gpulanes trial only and stops
it once that trial's jobs are done. In both modes accounts have ample fast
seconds and fair-relax levels stay 0 (relaxed is FIFO): those features answer
other questions.

Reading the tables: one row per (requested tier, mode). Latency is what the
worker measures, ``queued_ms + run_ms``, from publishing. ``within budget``:
share of the tier's jobs whose latency met its lane budget. ``moved down``:
``downgrade_reason`` counts, with those jobs' median latency; ``ran in``: the
lanes they really ran in; ``no result``: accepted jobs with no result when the
wait ended (must be 0). Per mode: the rate really offered, jobs served per
second over window + drain, the mean latency of all jobs (scheduling moves
waiting between jobs, it adds no capacity), the drain time, the client's CPU
per job and beat's CPU as a share of one core. The lines below compare the
modes; the first says how hard the pool was really driven, against what it
served in plain mode.
"""
from __future__ import annotations

import argparse
import gc
import json
import os
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections import Counter
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:  # run as a script: make the project importable
    sys.path.insert(0, str(ROOT))

MODES = ("gpulanes", "plain")
TIERS = ("fast", "standard", "relaxed")
DEFAULT_MIX = "20,30,50"
ACCOUNTS = ("acme", "globex", "initech", "umbrella")
PROMPT = "a lighthouse in a storm"
LOAD_FACTOR = 2.0
FAST_BUDGET_JOBS, STANDARD_BUDGET_JOBS = 10, 60
HEARTBEAT_S = 0.5
CAPACITY_JOBS, CAPACITY_BURSTS = 60, 3
WARMUP_JOBS = 12


@dataclass(frozen=True)
class JobSize:
    steps: int
    size: int


@dataclass(frozen=True)
class Budgets:
    job_s: float
    fast_s: float
    standard_s: float

    @classmethod
    def from_capacity(cls, capacity: float, workers: int) -> "Budgets":
        job_s = workers / capacity
        return cls(job_s, FAST_BUDGET_JOBS * job_s, STANDARD_BUDGET_JOBS * job_s)

    def env(self) -> dict[str, str]:
        """The settings beat reads (budgets, and the service time before any is measured)."""
        return {"GPULANES_MAX_WAIT_FAST_S": f"{self.fast_s:.3f}",
                "GPULANES_MAX_WAIT_STANDARD_S": f"{self.standard_s:.3f}",
                "GPULANES_DEFAULT_SERVICE_S": f"{self.job_s:.4f}"}


def configure_env(state_dir: Path) -> None:
    """Point gpulanes at a private Redis in ``state_dir``; must run before importing tasks."""
    os.environ.update({
        "GPULANES_BROKER_URL": f"redis+socket://{state_dir}/redis.sock",
        "GPULANES_STATE_DIR": str(state_dir),
        "GPULANES_ARTIFACT_DIR": str(state_dir / "artifacts"),
        "GPULANES_MODEL_DIR": str(state_dir / "models"),
        "GPULANES_DEVICE": "cpu",
        "GPULANES_HEARTBEAT_S": str(HEARTBEAT_S),
        "GPULANES_HEARTBEAT_REPLY_S": "0.3",
        "GPULANES_FAST_SECONDS_DEFAULT": "1e9",  # fast-time accounting never interferes
        "GPULANES_FAIR_UNIT_S": "1e9",  # every account stays at relax level 0: FIFO
        "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])),
    })


# --- publishing ----------------------------------------------------------------------
def plain_kwargs(tier: str, account: str, seed: int, size: JobSize) -> dict[str, Any]:
    """The kwargs a plain Celery user sends: the same shape ``submit`` builds."""
    job = {"prompt": PROMPT, "tier": tier, "account": account, "model": "demo", "seed": seed,
           "steps": size.steps, "width": size.size, "height": size.size,
           "downgradable": tier == "standard"}
    return {"job": job, "route": {"lane": tier, "requested_tier": tier},
            "submitted_at": time.time()}


def send(mode: str, tier: str, account: str, seed: int, size: JobSize) -> Any:
    """Publish one job; in gpulanes mode this may raise ``LaneFull``."""
    from tasks.api import submit
    from tasks.generate import generate

    if mode == "gpulanes":
        return submit(PROMPT, tier=tier, account=account, seed=seed, steps=size.steps,
                      width=size.size, height=size.size)
    return generate.apply_async(kwargs=plain_kwargs(tier, account, seed, size), queue=tier)


# --- capacity ------------------------------------------------------------------------
def start_to_start_rate(done: list[dict]) -> float:
    """Jobs/s of the pool: per worker, one over its mean start-to-start time, summed."""
    starts: dict[str, list[float]] = {}
    for result in done:
        starts.setdefault(result["worker"], []).append(result["started_at"])
    rates = [(len(s) - 1) / (max(s) - min(s)) for s in starts.values() if len(s) > 1]
    return sum(rates)


def measure_capacity(size: JobSize) -> tuple[float, float]:
    """(jobs/s of the pool, mean run_ms): the best of a few bursts through all lanes,
    after a warm-up (load from outside this benchmark can only lower a burst's rate)."""
    from celery.result import ResultSet

    warm = [send("plain", TIERS[i % 3], ACCOUNTS[0], i, size) for i in range(WARMUP_JOBS)]
    ResultSet(warm).get(timeout=120)
    bursts = []
    for _ in range(CAPACITY_BURSTS):
        jobs = [send("plain", TIERS[i % 3], ACCOUNTS[i % 4], i, size)
                for i in range(CAPACITY_JOBS)]
        bursts.append(ResultSet(jobs).get(timeout=300))
    best = max(bursts, key=start_to_start_rate)
    return start_to_start_rate(best), statistics.fmean(r["run_ms"] for r in best)


# --- beat, for the gpulanes trials only ------------------------------------------------
class Beat:
    """One ``celery beat`` process with the budgets; a fresh snapshot each start."""

    def __init__(self, cluster: Any, budgets: Budgets, log_dir: Path) -> None:
        self.env = {**cluster.env, **budgets.env()}
        self.log_dir, self.process = log_dir, None
        self.client = cluster.redis.client()

    def start(self) -> None:
        from gpu_worker.processes import spawn
        from routing.names import SNAPSHOT_KEY, WORKERS_KEY

        self.client.delete(SNAPSHOT_KEY, WORKERS_KEY)  # no hysteresis carried over
        log = open(self.log_dir / "beat.log", "ab")
        self.process = spawn([sys.executable, "-m", "celery", "-A", "tasks", "beat",
                              "--loglevel", "INFO"], env=self.env, stdout=log,
                             stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        log.close()
        wait_for_live_view(self.client, time.time(), self.process)

    def cpu_s(self) -> float:
        """CPU seconds beat has used so far (Linux ``/proc``; 0 elsewhere)."""
        try:
            fields = Path(f"/proc/{self.process.pid}/stat").read_text().rsplit(")", 1)[1].split()
        except (OSError, AttributeError, IndexError):
            return 0.0
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        self.process = None


def wait_for_live_view(client: Any, since: float, process: subprocess.Popen,
                       timeout_s: float = 60) -> None:
    """Block until this process routes from a snapshot beat wrote after ``since``."""
    from routing.names import SNAPSHOT_KEY
    from tasks.api import snapshot_cache

    deadline = time.monotonic() + timeout_s
    while not client.exists(SNAPSHOT_KEY) or (view := snapshot_cache().view()) is None \
            or view.at < since:
        if process.poll() is not None or time.monotonic() > deadline:
            raise RuntimeError("beat wrote no snapshot; see logs/beat.log")
        time.sleep(0.1)


# --- one trial ------------------------------------------------------------------------
@dataclass
class Trial:
    mode: str
    offered: int = 0
    accepted: list[tuple[str, Any]] = field(default_factory=list)
    refused: Counter = field(default_factory=Counter)
    submit_s: float = 0.0
    drain_s: float = 0.0
    outcomes: list[dict[str, Any]] = field(default_factory=list)
    queued_at_deadline: int = 0
    client_cpu_s: float = 0.0
    beat_cpu_s: float = 0.0


def workload(rate: float, duration_s: float, mix: dict[str, float],
             seed: int) -> list[tuple[float, str, str]]:
    """(offset s, tier, account) of every job: evenly spaced, tiers and accounts drawn."""
    rng = random.Random(seed)
    tiers, weights = list(mix), list(mix.values())
    return [(i / rate, rng.choices(tiers, weights)[0], rng.choice(ACCOUNTS))
            for i in range(int(rate * duration_s))]


def offer(trial: Trial, plan: list[tuple[float, str, str]], size: JobSize) -> None:
    """Open loop: each job at its time (at once when late), whatever the backlog."""
    from tasks.errors import LaneFull

    began, cpu = time.monotonic(), time.process_time()
    for seed, (offset, tier, account) in enumerate(plan):
        pause = began + offset - time.monotonic()
        if pause > 0:
            time.sleep(pause)
        try:
            trial.accepted.append((tier, send(trial.mode, tier, account, seed, size)))
        except LaneFull:
            trial.refused[tier] += 1
    trial.offered, trial.submit_s = len(plan), time.monotonic() - began
    trial.client_cpu_s = time.process_time() - cpu  # this process, its threads included


def lanes_depth(client: Any) -> int:
    from beat.heartbeat import lane_depths

    return sum(lane_depths(client).values())


def drain(trial: Trial, limit_s: float, client: Any) -> None:
    """Wait (at most ``limit_s``) for every accepted job; record what each became."""
    from celery.exceptions import TimeoutError as CeleryTimeout
    from celery.result import ResultSet

    began = time.monotonic()
    try:
        ResultSet([r for _, r in trial.accepted]).join_native(timeout=limit_s, propagate=False)
    except CeleryTimeout:
        trial.queued_at_deadline = lanes_depth(client)
    trial.drain_s = time.monotonic() - began
    for tier, result in trial.accepted:
        state = "done" if result.successful() else "failed" if result.failed() else "missing"
        trial.outcomes.append({"tier": tier, "state": state,
                               "result": result.result if state == "done" else None})


def run_trial(mode: str, beat: Beat, plan: list, size: JobSize, drain_s: float) -> Trial:
    trial = Trial(mode)
    try:
        if mode == "gpulanes":
            beat.start()
        beat_cpu_s = beat.cpu_s()  # beat's start-up is not the trial's cost
        offer(trial, plan, size)
        drain(trial, drain_s, beat.client)
        trial.beat_cpu_s = beat.cpu_s() - beat_cpu_s
    finally:
        beat.stop()
    return trial


# --- figures ---------------------------------------------------------------------------
def latency_s(result: dict) -> float:
    return (result["queued_ms"] + result["run_ms"]) / 1000


def percentile(values: list[float], q: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(q * (len(ordered) - 1))))]


def tier_row(trials: list[Trial], tier: str, budgets: Budgets) -> dict[str, Any]:
    """One (mode, tier) row over every repeat of that mode."""
    outs = [o for t in trials for o in t.outcomes if o["tier"] == tier]
    done = [o["result"] for o in outs if o["state"] == "done"]
    lat = [latency_s(r) for r in done]
    budget = {"fast": budgets.fast_s, "standard": budgets.standard_s}.get(tier)
    return {
        "accepted": len(outs), "refused": sum(t.refused[tier] for t in trials),
        "p50_s": percentile(lat, 0.50), "p95_s": percentile(lat, 0.95),
        "within_budget": (sum(x <= budget for x in lat) / len(lat)) if budget and lat else None,
        "moved": moved_latency(done),
        "ran_in": dict(Counter(r["lane"] for r in done)),
        "failed": sum(o["state"] == "failed" for o in outs),
        "no_result": sum(o["state"] == "missing" for o in outs),
    }


def moved_latency(done: list[dict]) -> dict[str, tuple[int, float]]:
    """downgrade_reason -> (jobs, their median latency s)."""
    by_reason: dict[str, list[float]] = {}
    for r in done:
        if r.get("downgrade_reason"):
            by_reason.setdefault(r["downgrade_reason"], []).append(latency_s(r))
    return {k: (len(v), statistics.median(v)) for k, v in sorted(by_reason.items())}


def mode_row(trials: list[Trial]) -> dict[str, Any]:
    """Per mode: rates, served jobs/s, mean latency, drain time."""
    done = [o["result"] for t in trials for o in t.outcomes if o["state"] == "done"]
    busy_s = sum(t.submit_s + t.drain_s for t in trials)
    return {
        "offered_jobs_s": sum(t.offered for t in trials) / sum(t.submit_s for t in trials),
        "accepted": sum(len(t.accepted) for t in trials),
        "served_jobs_s": len(done) / busy_s,
        "mean_latency_s": statistics.fmean(latency_s(r) for r in done) if done else None,
        "drain_s": statistics.fmean(t.drain_s for t in trials),
        "queued_at_deadline": sum(t.queued_at_deadline for t in trials),
        "client_cpu_ms_per_job": 1000 * sum(t.client_cpu_s for t in trials)
        / max(1, sum(t.offered for t in trials)),
        "beat_cpu_share": sum(t.beat_cpu_s for t in trials) / busy_s,
    }


def summary(trials: list[Trial], budgets: Budgets) -> dict[str, Any]:
    by_mode = {m: [t for t in trials if t.mode == m] for m in MODES}
    return {"tiers": {m: {tier: tier_row(ts, tier, budgets) for tier in TIERS}
                      for m, ts in by_mode.items()},
            "modes": {m: mode_row(ts) for m, ts in by_mode.items()}}


# --- report ----------------------------------------------------------------------------
def fmt(value: float | None, pattern: str = "{:.2f}") -> str:
    return "-" if value is None else pattern.format(value)


def counts(mapping: dict[str, Any]) -> str:
    """{"a": 3} -> "a 3"; {"a": (3, 1.5)} -> "a 3 (p50 1.5s)"."""
    return ", ".join(f"{k} {v[0]} (p50 {v[1]:.1f}s)" if isinstance(v, (tuple, list))
                     else f"{k} {v}" for k, v in sorted(mapping.items())) or "-"


def tier_table(tiers: dict[str, dict[str, dict]]) -> str:
    lines = ["| tier | mode | accepted | LaneFull | p50 s | p95 s | within budget "
             "| moved down (reason n) | ran in | failed | no result |",
             "|---|---|---:|---:|---:|---:|---:|---|---|---:|---:|"]
    for tier in TIERS:
        for mode in MODES:
            r = tiers[mode][tier]
            lines.append(f"| {tier} | {mode} | {r['accepted']} | {r['refused']} "
                         f"| {fmt(r['p50_s'])} | {fmt(r['p95_s'])} "
                         f"| {fmt(r['within_budget'], '{:.0%}')} | {counts(r['moved'])} "
                         f"| {counts(r['ran_in'])} | {r['failed']} | {r['no_result']} |")
    return "\n".join(lines)


def mode_table(modes: dict[str, dict]) -> str:
    lines = ["| mode | offered jobs/s | accepted | served jobs/s | mean latency s "
             "| drain s | still queued at deadline | client CPU ms/job | beat CPU (of one core) |",
             "|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for mode in MODES:
        m = modes[mode]
        lines.append(f"| {mode} | {m['offered_jobs_s']:.1f} | {m['accepted']} "
                     f"| {m['served_jobs_s']:.1f} | {fmt(m['mean_latency_s'])} "
                     f"| {m['drain_s']:.1f} | {m['queued_at_deadline']} "
                     f"| {m['client_cpu_ms_per_job']:.2f} | {m['beat_cpu_share']:.0%} |")
    return "\n".join(lines)


def compare(tiers: dict[str, dict[str, dict]], tier: str, key: str) -> str:
    """'<tier> gpulanes X vs plain Y (better|worse|same)' for a lower-is-better key."""
    g, p = tiers["gpulanes"][tier][key], tiers["plain"][tier][key]
    if g is None or p is None:
        return f"{tier} n/a"
    word = "within 5%" if abs(g - p) <= 0.05 * max(p, 1e-9) else "better" if g < p else "worse"
    return f"{tier} {g:.2f} vs {p:.2f} ({word})"


def load_line(report: dict[str, Any]) -> str:
    """How hard the pool was really driven, against what plain mode actually served."""
    served = report["summary"]["modes"]["plain"]["served_jobs_s"]
    above = sum(report["mix"][t] for t in ("fast", "standard")) * report["offered_jobs_s"]
    offered = report["offered_jobs_s"]
    return (f"offered {offered:.1f} jobs/s = {offered / served:.2f}x what the pool served in "
            f"plain mode ({served:.1f}/s); fast+standard alone {above:.1f}/s = "
            f"{above / served:.2f}x")


def policy_line(tiers: dict[str, dict[str, dict]]) -> str:
    moved = Counter({f"{tier} {reason}": n for tier, row in tiers["gpulanes"].items()
                     for reason, (n, _) in row["moved"].items()})
    if not moved:
        return ("the gpulanes policy never moved a job: both modes ran the same lanes in the "
                "same order, so any gap between them is beat/submit overhead or noise")
    return f"gpulanes moved jobs down (requested tier, reason): {counts(dict(moved))}"


def verdict(report: dict[str, Any]) -> list[str]:
    tiers, modes = report["summary"]["tiers"], report["summary"]["modes"]
    lost = sum(r["no_result"] for m in MODES for r in tiers[m].values())
    within = {t: [fmt(tiers[m][t]["within_budget"], "{:.0%}") for m in MODES]
              for t in ("fast", "standard")}
    return [load_line(report), policy_line(tiers),
            "within budget (gpulanes / plain): " + ", ".join(
                f"{t} {g} / {p}" for t, (g, p) in within.items()),
            "p95 latency s, gpulanes vs plain: " + "; ".join(
                compare(tiers, t, "p95_s") for t in TIERS),
            f"mean latency over all jobs: gpulanes {fmt(modes['gpulanes']['mean_latency_s'])}s,"
            f" plain {fmt(modes['plain']['mean_latency_s'])}s (a policy moves waiting between "
            "tiers; it adds no capacity)",
            f"jobs without a result: {lost} (must be 0)"]


# --- driver ------------------------------------------------------------------------------
@dataclass(frozen=True)
class Settings:
    workers: int
    duration_s: float
    drain_s: float
    repeats: int
    size: JobSize
    mix: dict[str, float]
    seed: int


def run_all(cluster: Any, settings: Settings, state_dir: Path) -> dict[str, Any]:
    """Capacity first, then every trial, the mode order alternating per repeat."""
    capacity, run_ms = measure_capacity(settings.size)
    budgets = Budgets.from_capacity(capacity, settings.workers)
    rate = LOAD_FACTOR * capacity
    print(f"capacity {capacity:.1f} jobs/s (run {run_ms:.1f} ms, job-time "
          f"{budgets.job_s * 1000:.1f} ms); offering {rate:.1f} jobs/s; budgets fast "
          f"{budgets.fast_s:.2f}s, standard {budgets.standard_s:.2f}s", file=sys.stderr, flush=True)
    beat = Beat(cluster, budgets, state_dir / "logs")
    plan, trials = workload(rate, settings.duration_s, settings.mix, settings.seed), []
    for repeat in range(settings.repeats):
        for mode in (MODES if repeat % 2 == 0 else MODES[::-1]):
            trials.append(run_trial(mode, beat, plan, settings.size, settings.drain_s))
            t = trials[-1]
            print(f"  repeat {repeat} {mode:<8} offered {t.offered} in {t.submit_s:.1f}s, "
                  f"refused {sum(t.refused.values())}, drained in {t.drain_s:.1f}s",
                  file=sys.stderr, flush=True)
    return {"capacity_jobs_s": capacity, "run_ms": run_ms, "offered_jobs_s": rate,
            "mix": settings.mix, "budgets": asdict(budgets), "summary": summary(trials, budgets)}


def benchmark(settings: Settings, state_dir: Path) -> dict[str, Any]:
    """Start the cluster (no beat), run everything, stop the cluster."""
    from tasks import app
    from tasks.cluster import LocalCluster

    cluster = LocalCluster(state_dir, workers=settings.workers, device="cpu", beat=False,
                           log_dir=state_dir / "logs")
    interrupted = False
    try:
        print(f"starting embedded Redis and {settings.workers} CPU workers ...",
              file=sys.stderr, flush=True)
        cluster.start(app, fresh=True)
        return run_all(cluster, settings, state_dir)
    except KeyboardInterrupt:
        # Re-raised only below: leaving this block drops the traceback, so the frames
        # holding AsyncResults go while Redis still answers (their __del__ unsubscribes;
        # after Redis stops it would retry for ~20 s at exit).
        interrupted = True
    finally:
        if interrupted:
            gc.collect()
        cluster.stop()
    raise KeyboardInterrupt


def check_size(size: JobSize) -> None:
    """Fail on a bad --steps/--size before any process starts."""
    from tasks.errors import InvalidJob
    from tasks.schema import validate

    try:
        validate(PROMPT, tier="fast", account=ACCOUNTS[0], model="demo", seed=0,
                 steps=size.steps, width=size.size, height=size.size)
    except InvalidJob as exc:
        raise SystemExit(f"benchmarks/overload.py: bad --steps/--size: {exc}") from exc


def tier_mix(raw: str) -> dict[str, float]:
    """``"20,30,50"`` -> {"fast": 0.2, "standard": 0.3, "relaxed": 0.5}."""
    parts = [float(x) for x in raw.split(",")]
    if len(parts) != len(TIERS) or min(parts) < 0 or sum(parts) <= 0:
        raise argparse.ArgumentTypeError("expected three non-negative percentages")
    return {tier: part / sum(parts) for tier, part in zip(TIERS, parts)}


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python benchmarks/overload.py", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--workers", type=int, default=2, help="CPU workers (default: 2)")
    parser.add_argument("--duration", type=float, default=30.0,
                        help="seconds of offered load per trial (default: 30)")
    parser.add_argument("--drain", type=float, default=None,
                        help="longest wait for the backlog (default: 2 x duration + 30)")
    parser.add_argument("--repeats", type=int, default=1, help="trials per mode (default: 1)")
    parser.add_argument("--steps", type=int, default=16, help="denoising steps per job")
    parser.add_argument("--size", type=int, default=128, help="image side in pixels")
    parser.add_argument("--mix", type=tier_mix, default=tier_mix(DEFAULT_MIX),
                        help="percent fast,standard,relaxed (default: %s)" % DEFAULT_MIX)
    parser.add_argument("--seed", type=int, default=7, help="seed of the job sequence")
    parser.add_argument("--json", type=Path, metavar="PATH", help="also write results here")
    args = parser.parse_args(argv)
    if args.workers < 1 or args.repeats < 1 or args.duration <= 0:
        parser.error("--workers and --repeats must be >= 1, --duration > 0")
    return args


def print_report(report: dict[str, Any], settings: Settings) -> None:
    print(tier_table(report["summary"]["tiers"]))
    print()
    print(mode_table(report["summary"]["modes"]))
    print()
    for line in verdict(report):
        print(f"- {line}")
    b = report["budgets"]
    mix = "/".join(f"{settings.mix[t]:.0%}" for t in TIERS)
    print(f"mix fast/standard/relaxed {mix}; {settings.workers} CPU workers, "
          f"{settings.size.steps} steps at {settings.size.size}px: capacity "
          f"{report['capacity_jobs_s']:.1f} jobs/s, offered {report['offered_jobs_s']:.1f} "
          f"jobs/s for {settings.duration_s:g}s per trial, {settings.repeats} repeat(s); "
          f"budgets fast {b['fast_s']:.2f}s, standard "
          f"{b['standard_s']:.2f}s; total wall time {report['wall_s']:.1f}s")


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    settings = Settings(args.workers, args.duration, args.drain or 2 * args.duration + 30,
                        args.repeats, JobSize(args.steps, args.size), args.mix, args.seed)
    began = time.monotonic()
    state_dir = Path(tempfile.mkdtemp(prefix="gl-ovl-", dir="/tmp"))  # short: socket path
    try:
        configure_env(state_dir)
        check_size(settings.size)
        report = benchmark(settings, state_dir)
    except KeyboardInterrupt:
        print("interrupted; the cluster is stopped", file=sys.stderr)
        return 130
    finally:
        shutil.rmtree(state_dir, ignore_errors=True)
    report["wall_s"] = round(time.monotonic() - began, 1)
    print_report(report, settings)
    if args.json:
        args.json.write_text(json.dumps(report, indent=2, default=str) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
