"""Fair relax: how long light and heavy users wait in the relaxed lane.

``python benchmarks/fairness.py`` starts one local cluster (embedded Redis,
ONE CPU worker, beat) and, for each mode, lets a *heavy* account that has
already used the cluster in this window queue a burst of relaxed jobs, with
a few *light* accounts' jobs arriving right behind it:

- *gpulanes*: ``submit(..., tier="relaxed")``; the heavy account's recent
  GPU seconds put its jobs in a later priority level of the relaxed lane.
- *plain Celery*: the same jobs published to the ``relaxed`` queue in
  arrival order, one FIFO list, as plain Celery does.

Then a starvation check: the heavy account queues one job right after a
stream of newcomers' jobs that takes longer than ``GPULANES_FAIR_AGING_S`` to
drain; its wait must stay near the aging bound, not the length of the stream.

Waits are submit-to-start, stamped by the worker. Modes are interleaved per
repeat so machine noise hits both.
"""
from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

AGING_S = 3.0
UNIT_S = 0.05
JOB = dict(steps=8, width=128, height=128)


def configure_env(state_dir: Path) -> None:
    """A private Redis and small fairness units; must run before importing tasks."""
    os.environ.update({
        "GPULANES_BROKER_URL": f"redis+socket://{state_dir}/redis.sock",
        "GPULANES_STATE_DIR": str(state_dir), "GPULANES_DEVICE": "cpu",
        "GPULANES_ARTIFACT_DIR": str(state_dir / "artifacts"),
        "GPULANES_MODEL_DIR": str(state_dir / "models"),
        "GPULANES_HEARTBEAT_S": "0.5", "GPULANES_FAIR_UNIT_S": str(UNIT_S),
        "GPULANES_FAIR_AGING_S": str(AGING_S),
    })


def send(mode: str, account: str, seed: int) -> Any:
    """One relaxed job through gpulanes, or straight onto the FIFO relaxed queue."""
    from routing.lanes import route
    from tasks.api import submit
    from tasks.generate import generate
    from tasks.schema import validate

    if mode == "gpulanes":
        return submit(f"job {seed}", tier="relaxed", account=account, seed=seed, **JOB)
    job = validate(f"job {seed}", tier="relaxed", account=account, model="demo",
                   seed=seed, **JOB)
    return generate.apply_async(kwargs={"job": job.as_dict(), "route": route("relaxed")
                                        .as_dict(), "submitted_at": time.time()},
                                queue="relaxed")


def make_heavy(account: str, jobs: int) -> None:
    """Give ``account`` recent usage and wait until routers rank it as heavy."""
    from tasks.api import snapshot_cache

    for result in [send("gpulanes", account, i) for i in range(jobs)]:
        result.get(timeout=120)
    deadline = time.monotonic() + 30
    while (view := snapshot_cache().view()) is None or not view.levels.get(account):
        if time.monotonic() > deadline:
            raise RuntimeError(f"{account} never became heavy")
        time.sleep(0.1)


def burst(mode: str, heavy: int, light: int, tag: str) -> dict[str, list[float]]:
    """Heavy account's burst, then light accounts' jobs; waits in ms per group."""
    heavy_jobs = [send(mode, "heavy", 1000 + i) for i in range(heavy)]
    # fresh light accounts each time: a light user has not used the cluster yet
    light_jobs = [send(mode, f"light-{tag}-{i}", 2000 + i) for i in range(light)]
    waits = {"heavy": [r.get(timeout=300)["queued_ms"] for r in heavy_jobs],
             "light": [r.get(timeout=300)["queued_ms"] for r in light_jobs]}
    return waits


def starvation(jobs: int) -> tuple[float, float]:
    """(heavy job's wait, stream length) in seconds, under a newcomers' stream."""
    stream = [send("gpulanes", f"new{i}", 9001 + i) for i in range(jobs)]
    heavy = send("gpulanes", "heavy", 9000)  # behind the whole stream, at a later level
    waited_s = heavy.get(timeout=300)["queued_ms"] / 1000
    last = max(r.get(timeout=300)["started_at"] for r in stream)
    return waited_s, last - stream[0].get(timeout=300)["started_at"]


def run(repeats: int, heavy: int, light: int) -> None:
    from tasks import app
    from tasks.cluster import LocalCluster

    state = Path(os.environ["GPULANES_STATE_DIR"])
    cluster = LocalCluster(state, workers=1, device="cpu", beat=True)
    try:
        cluster.start(app)
        make_heavy("heavy", 20)
        waits = {mode: {"heavy": [], "light": []} for mode in ("plain", "gpulanes")}
        for rep in range(repeats):
            for mode in (("plain", "gpulanes") if rep % 2 == 0 else ("gpulanes", "plain")):
                for group, values in burst(mode, heavy, light, f"{mode}{rep}").items():
                    waits[mode][group] += values
        report(waits, heavy, light)
        report_starvation(*starvation(jobs=250))
    finally:
        cluster.stop()


def report(waits: dict, heavy: int, light: int) -> None:
    print(f"\n{heavy} relaxed jobs of a heavy account, then {light} of light accounts, "
          "one worker (wait = submit to start, ms)\n")
    print("| mode | light p50 | light max | heavy p50 | heavy max |")
    print("|---|---:|---:|---:|---:|")
    for mode in ("plain", "gpulanes"):
        light_w, heavy_w = waits[mode]["light"], waits[mode]["heavy"]
        print(f"| {'plain Celery FIFO' if mode == 'plain' else 'gpulanes'} | "
              f"{statistics.median(light_w):.0f} | {max(light_w):.0f} | "
              f"{statistics.median(heavy_w):.0f} | {max(heavy_w):.0f} |")
    ratio = statistics.median(waits["plain"]["light"]) / max(
        statistics.median(waits["gpulanes"]["light"]), 1e-3)
    print(f"\nlight users wait {ratio:.1f}x less with gpulanes (p50)")


def report_starvation(waited_s: float, stream_s: float) -> None:
    print(f"\nstarvation check: a heavy user's job behind a {stream_s:.1f}s stream of "
          f"newcomers waited {waited_s:.1f}s (aging bound {AGING_S:g}s + beat rounds); "
          f"{'bounded' if waited_s < stream_s else 'NOT bounded'}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--heavy", type=int, default=30, help="jobs in the heavy burst")
    parser.add_argument("--light", type=int, default=6, help="light users' jobs")
    args = parser.parse_args(argv)
    state = Path(tempfile.mkdtemp(prefix="gl-fair-", dir="/tmp"))
    configure_env(state)
    began = time.monotonic()
    try:
        run(args.repeats, args.heavy, args.light)
    finally:
        shutil.rmtree(state, ignore_errors=True)
    print(f"total wall time {time.monotonic() - began:.0f}s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
