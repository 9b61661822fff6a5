"""Autoscaling, live: a small real cluster that grows and shrinks with its scaling signal.

``python benchmarks/autoscale.py`` starts a private cluster: an embedded Redis, beat,
the exporter (``/scaling``, the JSON KEDA's ``metrics-api`` trigger reads) and a loop
that does what KEDA and the HPA do with it: every ``--poll-s`` it reads the default
pool's ``wanted`` over HTTP and starts or stops single-worker supervisors
(``python -m gpu_worker --workers 1 --instance wN``, one per pod on Kubernetes) to
match, between ``--least`` and ``--most``. A scale-down is a SIGTERM to the newest
supervisor: its worker hands its running job on and exits.

Standard jobs of the ``paced`` model (``benchmarks/paced_model.py``: steps of a set
time, as a GPU's) arrive as a Poisson stream: ``--low`` per second for ``--low-s``,
then a step up to ``--high`` for ``--high-s``, then a step down to ``--low`` until the
fleet is back to ``--least`` (at most ``--down-s``). Beat's scaling runs as shipped:
its boot estimate (60 s) and its 300 s scale-down hysteresis included.

It reports the seconds from the step up until the signal asked for more and until
enough workers served (as many as it asked, up to ``--most``), the waits before,
during and after the step, each scale-down, the worker-seconds against a fixed fleet
of ``--most``, and every job counted once settled. It exits 1 when a job was lost,
failed or ran to its end twice, a stopped supervisor exited other than 0, the fleet
never had enough workers, or it was not back to ``--least`` at the end.
"""
from __future__ import annotations

import argparse
import json
import random
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

if not __package__:  # run as a script: make the project importable
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from benchmarks.autoscale_figures import Sample, figures, follow, report  # noqa: E402
from benchmarks.common import finish, free_port, json_option, run_private  # noqa: E402
from tests.harness.faults import JobStream, settle  # noqa: E402

MODELS = "paced=benchmarks.paced_model:Paced"
POOL = "default"
#: Seconds between the loop's looks at its supervisors (it reads /scaling every --poll-s).
TICK_S = 0.1


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--least", type=int, default=1, help="fewest workers")
    parser.add_argument("--most", type=int, default=4, help="most workers")
    parser.add_argument("--poll-s", type=float, default=5.0,
                        help="how often the loop reads /scaling (KEDA's pollingInterval)")
    parser.add_argument("--low", type=float, default=0.2, help="jobs/s before and after")
    parser.add_argument("--high", type=float, default=1.5, help="jobs/s in the step")
    parser.add_argument("--low-s", type=float, default=120.0)
    parser.add_argument("--high-s", type=float, default=180.0)
    parser.add_argument("--down-s", type=float, default=1500.0,
                        help="longest the loop waits after the step for the fleet to shrink")
    parser.add_argument("--steps", type=int, default=20, help="steps of a job")
    parser.add_argument("--step-ms", type=int, default=100, help="milliseconds of a step")
    parser.add_argument("--seed", type=int, default=7, help="the arrivals' seed")
    json_option(parser, "autoscale")
    return parser.parse_args(argv)


class Fleet:
    """Single-worker supervisors, started and stopped by name; every event noted."""

    def __init__(self, state: Path) -> None:
        self.state, self.logs = state, state / "logs"
        self.running: dict[str, subprocess.Popen] = {}  # started, not told to stop
        self.stopping: dict[str, tuple[subprocess.Popen, float]] = {}
        self.events: list[dict[str, Any]] = []
        self.exits: dict[str, int] = {}
        self.made = 0

    def _spawn(self, name: str, args: list[str]) -> subprocess.Popen:
        from gpu_worker.processes import spawn

        self.logs.mkdir(parents=True, exist_ok=True)
        log = open(self.logs / f"{name}.log", "ab")
        return spawn([sys.executable, *args], stdout=log, stderr=subprocess.STDOUT,
                     stdin=subprocess.DEVNULL)

    def resize(self, wanted: int) -> None:
        """Start or stop supervisors until ``wanted`` run (the newest stop first)."""
        while len(self.running) < wanted:
            self.made += 1
            name = f"w{self.made}"
            self.running[name] = self._spawn(name, ["-m", "gpu_worker", "--workers", "1",
                                                    "--device", "cpu", "--instance", name])
            self.events.append({"at": time.time(), "start": name})
        while len(self.running) > wanted:
            name, process = self.running.popitem()
            process.send_signal(signal.SIGTERM)  # as Kubernetes stops a pod
            self.stopping[name] = (process, time.time())
            self.events.append({"at": time.time(), "stop": name})

    def reap(self) -> None:
        """Note the stopped supervisors that exited."""
        for name, (process, sent) in list(self.stopping.items()):
            if (code := process.poll()) is not None:
                self.exits[name] = code
                self.events.append({"at": time.time(), "exited": name, "code": code,
                                    "after_s": round(time.time() - sent, 2)})
                del self.stopping[name]

    def close(self, timeout_s: float = 120.0) -> None:
        self.resize(0)
        deadline = time.monotonic() + timeout_s
        while self.stopping and time.monotonic() < deadline:
            self.reap()
            time.sleep(0.2)
        for process, _ in self.stopping.values():
            process.kill()


class SteppedStream(JobStream):
    """Jobs as a Poisson stream at ``rate`` per second, which may change as it runs."""

    def __init__(self, args: argparse.Namespace) -> None:
        super().__init__(lambda i: dict(model="paced", tier="standard", n=i,
                                        steps=args.steps, step_ms=args.step_ms))
        self.rate, self.rng = args.low, random.Random(args.seed)

    def _run(self, rate_per_s: float, limit: int | None) -> None:
        while not self._stop.is_set():
            if self._stop.wait(self.rng.expovariate(self.rate)):
                return
            self.submit_one()


def scaling(url: str) -> dict[str, Any]:
    """The default pool's scale, as KEDA reads it."""
    with urllib.request.urlopen(url, timeout=5) as response:
        return json.loads(response.read()).get("pools", {}).get(POOL, {})


def bench(state: Path, args: argparse.Namespace) -> dict[str, Any]:
    from gpu_worker.processes import spawn
    from beat.scaling import read
    from gpu_worker.redis_server import EmbeddedRedis
    from tasks.ops.metrics import serve

    redis_server = EmbeddedRedis(state)
    redis_server.start()
    client = redis_server.client()
    server = serve(client, port=free_port())
    url = f"http://127.0.0.1:{server.server_port}/scaling"
    (state / "logs").mkdir(parents=True, exist_ok=True)
    beat = spawn([sys.executable, "-m", "celery", "-A", "tasks", "beat"],
                 stdout=open(state / "logs" / "beat.log", "ab"), stderr=subprocess.STDOUT)
    fleet, stream, samples = Fleet(state), SteppedStream(args), []
    phases: dict[str, float] = {}
    try:
        fleet.resize(args.least)
        _wait_serving(url, args.least)
        phases["low"] = time.time()
        stream.start(args.low)
        polled = 0.0
        while True:
            fleet.reap()  # between polls too: an exit is timed to a tick, not to a poll
            now = time.time()
            if now - polled < args.poll_s:
                time.sleep(TICK_S)
                continue
            polled = now
            if "high" not in phases and now - phases["low"] >= args.low_s:
                phases["high"], stream.rate = now, args.high
            if "down" not in phases and "high" in phases and now - phases["high"] >= args.high_s:
                phases["down"], stream.rate = now, args.low
            pool, kept = scaling(url), read(client).get(POOL, {})  # what KEDA reads; beat's doc
            fleet.resize(follow(pool.get("wanted", 0), args.least, args.most))
            samples.append(Sample(now, pool.get("wanted", 0), pool.get("current", 0),
                                  len(fleet.running), pool.get("need", 0.0),
                                  kept.get("hold", 0.0)))
            if "down" in phases and (now - phases["down"] >= args.down_s or (
                    len(fleet.running) == args.least and not fleet.stopping
                    and now - phases["down"] >= args.low_s)):
                break
        phases["end"] = time.time()
        stream.stop()
        counts = settle(stream, "autoscale", client, timeout_s=300)
        outs = [r.get(timeout=5) for r in stream.accepted.values() if r.state == "SUCCESS"]
    finally:
        stream.stop()
        fleet.close()
        beat.send_signal(signal.SIGTERM)
        beat.wait(30)
        server.shutdown()
        redis_server.stop()
    return figures(args, samples, phases, outs, counts, fleet.events, fleet.exits)


def _wait_serving(url: str, workers: int, timeout_s: float = 180.0) -> None:
    """Until beat counts ``workers`` workers of the pool."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            if scaling(url).get("current", 0) >= workers:
                return
        except OSError:
            pass
        time.sleep(0.5)
    raise TimeoutError(f"{workers} workers not serving after {timeout_s:.0f}s")


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    found = run_private("gl-scale-", lambda state: bench(state, args), "cluster stopped",
                        MODELS=MODELS, WARM_MODELS="paced")
    status = finish(found, report, args.json)
    return status or int(bool(found and found["missed"]))


if __name__ == "__main__":
    sys.exit(main())
