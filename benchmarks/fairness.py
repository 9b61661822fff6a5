"""Fair relax: how long light and heavy users wait in the relaxed lane.

``python benchmarks/fairness.py`` starts one local cluster (embedded Redis,
ONE gpulanes CPU worker, beat) and ONE plain Celery worker in its own process (a
Redis database of its own), and, for each mode, lets a *heavy* account that has
already used the cluster in this window queue a burst of relaxed jobs, with
a few *light* accounts' jobs arriving right behind it:

- *gpulanes*: ``submit(..., tier="relaxed")``; the heavy account's recent
  GPU seconds put its jobs in a later priority level of the relaxed lane.
- *plain Celery*: the same jobs (same demo model, same size) published by
  ``apply_async(queue="relaxed")`` on a default Celery app as a careful plain user
  writes it (``benchmarks/plain_app.py``: kombu's stock Redis transport, Celery's
  stock result backend, late acks, prefetch 1, JSON; its worker ``--pool threads
  -c 1 -E -Q fast,standard,relaxed``), from a process of its own that never imports
  gpulanes' client, app or transport: one FIFO list in arrival order, as plain
  Celery does. Plain Celery has no accounts; the account only names the group.

Then a starvation check: the heavy account queues one job right after a
stream of newcomers' jobs that takes longer than the aging bound (the standard
budget, ``GPULANES_MAX_WAIT_S``) to drain; its wait must stay near the aging
bound, not the length of the stream.

Waits are submit-to-start, stamped by the worker. Modes are interleaved per
repeat so machine noise hits both. Beat runs every 1 s
(``GPULANES_HEARTBEAT_S=1``): it works in whole seconds, so the 0.5 s this
benchmark used to set acted as 1 anyway.
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path
from typing import Any, Callable

if not __package__:  # run as a script: make the project importable
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from benchmarks.common import (  # noqa: E402
    JobSize,
    json_option,
    markdown_table,
    private_env,
    state_dir,
    write_json,
)
from benchmarks.plain_run import PlainClient, PlainWorkers, plain_env, plain_url  # noqa: E402

AGING_S = 3.0
HEARTBEAT_S = 1  # beat works in whole seconds; below 1 acts as 1
SIZE = JobSize(steps=8, size=128)
MODES = ("plain", "gpulanes")


#: (account, seed) -> the relaxed job's AsyncResult.
Send = Callable[[str, int], Any]


def send(account: str, seed: int) -> Any:
    """One relaxed job through gpulanes' ``submit()``."""
    from tasks.api import submit

    return submit(f"job {seed}", tier="relaxed", account=account, seed=seed,
                  steps=SIZE.steps, width=SIZE.size, height=SIZE.size)


def plain_burst(heavy: int, light: int, tag: str) -> dict[str, list[float]]:
    """:func:`burst` on the plain side, in the plain publisher's process: the same jobs
    straight onto the FIFO ``relaxed`` queue."""
    from benchmarks import plain_app

    return burst(lambda account, seed: plain_app.send("relaxed", f"job {seed}", seed, SIZE),
                 heavy, light, tag)


def make_heavy(account: str) -> None:
    """Give ``account`` recent usage (two fair-share units of GPU time, as its workers'
    stats pushes record it) and wait until routers rank it as heavy."""
    from routing.policy import FAIR_UNIT_S
    from tasks.broker.app import redis_client
    from tasks.broker.view import snapshot_cache
    from tasks.broker.keys import USAGE_BUCKET_S, usage_key

    bucket = usage_key(int(time.time()) // USAGE_BUCKET_S)
    redis_client().hincrbyfloat(bucket, account, 2 * FAIR_UNIT_S)
    deadline = time.monotonic() + 30
    while (view := snapshot_cache().view()) is None or not view.levels.get(account):
        if time.monotonic() > deadline:
            raise RuntimeError(f"{account} never became heavy")
        time.sleep(0.1)


def burst(publish: Send, heavy: int, light: int, tag: str) -> dict[str, list[float]]:
    """Heavy account's burst, then light accounts' jobs; waits in ms per group."""
    heavy_jobs = [publish("heavy", 1000 + i) for i in range(heavy)]
    # fresh light accounts each time: a light user has not used the cluster yet
    light_jobs = [publish(f"light-{tag}-{i}", 2000 + i) for i in range(light)]
    waits = {"heavy": [r.get(timeout=300)["queued_ms"] for r in heavy_jobs],
             "light": [r.get(timeout=300)["queued_ms"] for r in light_jobs]}
    return waits


def starvation(jobs: int) -> tuple[float, float]:
    """(heavy job's wait, stream length) in seconds, under a newcomers' stream."""
    stream = [send(f"new{i}", 9001 + i) for i in range(jobs)]
    heavy = send("heavy", 9000)  # behind the whole stream, at a later level
    waited_s = heavy.get(timeout=300)["queued_ms"] / 1000
    last = max(r.get(timeout=300)["started_at"] for r in stream)
    return waited_s, last - stream[0].get(timeout=300)["started_at"]


def run(state: Path, repeats: int, heavy: int, light: int) -> dict[str, Any]:
    """Start both workers, make one account heavy, run the bursts and the starvation check;
    the waits (ms) per mode and group, and the starvation check's seconds."""
    from tasks import app
    from tasks.dev.cluster import LocalCluster

    cluster = LocalCluster(state, workers=1, device="cpu", beat=True)
    try:
        cluster.start(app)
        env = plain_env(plain_url(cluster.url), state)
        with PlainWorkers(1, env, state / "logs"), PlainClient(env) as plain:
            make_heavy("heavy")
            waits = bursts(plain, repeats, heavy, light)
            report(waits, heavy, light)
        waited_s, stream_s = starvation(jobs=250)
        report_starvation(waited_s, stream_s)
        return {"heavy": heavy, "light": light, "repeats": repeats, "aging_s": AGING_S,
                "waits_ms": waits, "starvation": {"waited_s": waited_s, "stream_s": stream_s}}
    finally:
        cluster.stop()


def bursts(plain: PlainClient, repeats: int, heavy: int,
           light: int) -> dict[str, dict[str, list[float]]]:
    """Every mode's bursts, the order alternating per repeat; waits per mode and group."""
    waits: dict[str, dict[str, list[float]]] = {m: {"heavy": [], "light": []} for m in MODES}
    for rep in range(repeats):
        for mode in (MODES if rep % 2 == 0 else MODES[::-1]):
            tag = f"{mode}{rep}"
            got = (burst(send, heavy, light, tag) if mode == "gpulanes"
                   else plain.call(plain_burst, heavy, light, tag))
            for group, values in got.items():
                waits[mode][group] += values
    return waits


def report(waits: dict[str, dict[str, list[float]]], heavy: int, light: int) -> None:
    """The light and heavy accounts' waits per mode, and how much less light users wait."""
    print(f"\n{heavy} relaxed jobs of a heavy account, then {light} of light accounts, "
          "one worker (wait = submit to start, ms)\n")
    rows = [["plain Celery FIFO" if mode == "plain" else "gpulanes",
             *p50_max(waits[mode]["light"]), *p50_max(waits[mode]["heavy"])] for mode in MODES]
    print(markdown_table(["mode", "light p50", "light max", "heavy p50", "heavy max"], rows))
    ratio = statistics.median(waits["plain"]["light"]) / max(
        statistics.median(waits["gpulanes"]["light"]), 1e-3)
    print(f"\nlight users wait {ratio:.1f}x less with gpulanes (p50)")


def p50_max(waits_ms: list[float]) -> list[str]:
    """The median and the longest of ``waits_ms``, as table cells."""
    return [f"{statistics.median(waits_ms):.0f}", f"{max(waits_ms):.0f}"]


def report_starvation(waited_s: float, stream_s: float) -> None:
    """Whether the heavy job's wait stayed below the newcomers' stream."""
    print(f"\nstarvation check: a heavy user's job behind a {stream_s:.1f}s stream of "
          f"newcomers waited {waited_s:.1f}s (aging bound {AGING_S:g}s + beat rounds); "
          f"{'bounded' if waited_s < stream_s else 'NOT bounded'}")


def main(argv: list[str] | None = None) -> int:
    """Run both modes and the starvation check, print the tables and the wall time."""
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--heavy", type=int, default=30, help="jobs in the heavy burst")
    parser.add_argument("--light", type=int, default=6, help="light users' jobs")
    json_option(parser, "fairness")
    args = parser.parse_args(argv)
    with state_dir("gl-fair-") as state:
        private_env(state, HEARTBEAT_S=HEARTBEAT_S, MAX_WAIT_S=f"standard={AGING_S:g}")
        began = time.monotonic()
        figures = run(state, args.repeats, args.heavy, args.light)
    figures["wall_s"] = round(time.monotonic() - began, 1)
    print(f"total wall time {figures['wall_s']:.0f}s")
    write_json(args.json, figures)
    return 0


if __name__ == "__main__":
    sys.exit(main())
