"""What a worker spends in Redis per job: gpulanes' worker against a plain Celery worker.

``python benchmarks/perjob.py`` starts an embedded Redis and, in turn, two workers on
it, each serving a job that does nothing, so that what is left is the per-job path:

*gpulanes*: one gpulanes worker (``LocalCluster``, no beat) serving the ``echo``
model (no weights, warm), its jobs sent by ``submit(model="echo", tier="standard")``.
*plain*: a default Celery app in its own process (``benchmarks/perjob_plain.py``,
never importing gpulanes: kombu's stock transport, Celery's stock result backend),
``--pool threads -c 1 -E`` (events on, as for Flower), late acks, prefetch 1, a task
returning what echo returns, sent by ``apply_async``.

For each side: the worker answers, is paused (SIGSTOP), ``--jobs`` jobs are queued,
Redis' statistics are reset (``CONFIG RESETSTAT``) and the worker resumed; once every
job's result is stored, ``INFO commandstats`` gives the commands Redis ran. The same
wait with no jobs, as long again, gives the idle background (heartbeats, stats pushes,
this process's own snapshot reads), subtracted; so are this process's own polls for
the results (one ``EXISTS`` of every result key each 50 ms, counted). What remains,
per job, is the worker's per-job path. The drain time gives jobs/s end to end.

Goals (issue: a lean per-job path): gpulanes' commands per job <= 1.5x plain's, and
its jobs/s >= 0.7x plain's. ``--json`` writes the figures.
"""
from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any, Callable

if not __package__:  # run as a script: make the project importable
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from benchmarks.common import finish, json_option, markdown_table, run_private  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
GOAL_COMMANDS = 1.5
GOAL_RATE = 0.7
POLL_S = 0.05


def commandstats(client: Any) -> dict[str, int]:
    """Calls per command since the last reset (``INFO commandstats``)."""
    return {name.removeprefix("cmdstat_"): stats["calls"]
            for name, stats in client.info("commandstats").items()}


def _wait_done(client: Any, keys: list[str], timeout_s: float) -> int:
    """Poll until every result key exists; how many ``EXISTS`` this cost."""
    polls, deadline = 0, time.monotonic() + timeout_s
    while True:
        polls += 1
        if client.exists(*keys) == len(keys):
            return polls
        if time.monotonic() > deadline:
            raise SystemExit(f"benchmarks/perjob.py: {len(keys)} jobs not done in {timeout_s}s")
        time.sleep(POLL_S)


class ScriptCommands:
    """Counts the commands Redis runs inside Lua scripts while it lasts (``MONITOR``
    marks them ``lua``): what a side's scripts do for it, apart from what its
    processes send. A separate pass: ``MONITOR`` slows Redis down."""

    def __init__(self, client: Any) -> None:
        self.count, self._monitor = 0, client.monitor()
        self._thread = threading.Thread(target=self._listen, daemon=True)

    def __enter__(self) -> "ScriptCommands":
        self._monitor.__enter__()
        self._thread.start()
        return self

    def _listen(self) -> None:
        try:
            for command in self._monitor.listen():
                self.count += command.get("client_type") == "lua"
        except Exception:  # noqa: BLE001  the connection closed: the pass is over
            return

    def __exit__(self, *exc: Any) -> None:
        self._monitor.connection.disconnect()
        self._thread.join(5)


def in_scripts(client: Any, pid: int, send: Callable[[int], str], jobs: int) -> float:
    """Commands per job Redis runs inside Lua scripts for the worker ``pid`` (the idle
    background over as long a wait subtracted)."""
    os.kill(pid, signal.SIGSTOP)
    try:
        keys = [f"celery-task-meta-{send(i)}" for i in range(jobs)]
    finally:
        with ScriptCommands(client) as busy:
            os.kill(pid, signal.SIGCONT)
            began = time.perf_counter()
            _wait_done(client, keys, 600)
            took_s = time.perf_counter() - began
    with ScriptCommands(client) as idle:
        time.sleep(took_s)
    return max(0, busy.count - idle.count) / jobs


def measure(client: Any, pid: int, send: Callable[[int], str], jobs: int) -> dict[str, Any]:
    """Commands per job and jobs/s of the worker ``pid``, ``send(i)`` queuing job ``i``
    (its id); the idle background over as long a wait subtracted."""
    os.kill(pid, signal.SIGSTOP)
    try:
        keys = [f"celery-task-meta-{send(i)}" for i in range(jobs)]
        client.config_resetstat()
    finally:
        os.kill(pid, signal.SIGCONT)
    began = time.perf_counter()
    polls = _wait_done(client, keys, 600)
    took_s = time.perf_counter() - began
    busy = commandstats(client)
    client.config_resetstat()
    time.sleep(took_s)
    idle = commandstats(client)
    own = {"exists": polls, "config|resetstat": 1, "info": 1}
    per_job = {}
    for name in set(busy) | set(idle):
        calls = busy.get(name, 0) - idle.get(name, 0) - own.get(name, 0)
        if calls > 0:
            per_job[name] = calls / jobs
    scripted = in_scripts(client, pid, send, jobs)
    total = sum(per_job.values())
    return {"jobs": jobs, "seconds": took_s, "jobs_s": jobs / took_s,
            "commands_per_job": total, "per_job": per_job, "in_scripts_per_job": scripted,
            "sent_per_job": total - scripted}


def gpulanes_side(client: Any, state: Path, jobs: int) -> dict[str, Any]:
    from tests.harness.faults import worker_pids
    from tasks import app, submit
    from tasks.dev.cluster import LocalCluster

    cluster = LocalCluster(state, workers=1, device="cpu", beat=False,
                           log_dir=state / "logs").start(app, timeout_s=300)
    try:
        (pid,) = worker_pids(app, 1).values()
        submit(model="echo", text="warm-up", tier="standard").get(timeout=60)
        return measure(client, pid, lambda i: submit(model="echo", text=f"job {i}",
                                                     tier="standard").id, jobs)
    finally:
        cluster.stop()


def plain_side(client: Any, url: str, state: Path, jobs: int) -> dict[str, Any]:
    from celery import Celery

    env = {**os.environ, "PERJOB_BROKER_URL": url, "PYTHONPATH": str(ROOT)}
    log = open(state / "plain-worker.log", "ab")
    worker = subprocess.Popen(
        [sys.executable, "-m", "celery", "-A", "benchmarks.perjob_plain", "worker",
         "--pool", "threads", "-c", "1", "-E", "-Q", "standard", "-n", "plain@%h",
         "--loglevel", "WARNING"], env=env, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT)
    plain = Celery("plain", broker=url, backend=url, set_as_current=False)
    try:
        deadline = time.monotonic() + 120
        while not plain.control.ping(timeout=1):
            if time.monotonic() > deadline or worker.poll() is not None:
                raise SystemExit("benchmarks/perjob.py: the plain worker did not answer; "
                                 f"see {state / 'plain-worker.log'}")
        plain.send_task("perjob.echo", args=["warm-up"], queue="standard").get(timeout=60)
        return measure(client, worker.pid, lambda i: plain.send_task(
            "perjob.echo", args=[f"job {i}"], queue="standard").id, jobs)
    finally:
        worker.terminate()
        worker.wait(30)


def benchmark(args: argparse.Namespace, state: Path) -> dict[str, Any]:
    from gpu_worker.redis_server import EmbeddedRedis
    from tasks.settings import settings

    server = EmbeddedRedis(state).start()
    try:
        client = server.client()
        sides = {"plain": plain_side(client, settings.broker_url, state, args.jobs),
                 "gpulanes": gpulanes_side(client, state, args.jobs)}
    finally:
        server.stop()
    ours, plain = sides["gpulanes"], sides["plain"]
    return {"sides": sides,
            "commands_ratio": ours["commands_per_job"] / plain["commands_per_job"],
            "sent_ratio": ours["sent_per_job"] / plain["sent_per_job"],
            "rate_ratio": ours["jobs_s"] / plain["jobs_s"]}


def report(figures: dict[str, Any]) -> None:
    sides = figures["sides"]
    names = sorted(set(sides["gpulanes"]["per_job"]) | set(sides["plain"]["per_job"]),
                   key=lambda n: -sides["gpulanes"]["per_job"].get(n, 0))
    rows = [[f"`{name.upper()}`", f"{sides['gpulanes']['per_job'].get(name, 0):.2f}",
             f"{sides['plain']['per_job'].get(name, 0):.2f}"] for name in names]
    for label, key, digits in (("**all commands Redis ran**", "commands_per_job", 1),
                               ("of them inside Lua scripts", "in_scripts_per_job", 1),
                               ("commands sent (a script counts once)", "sent_per_job", 1),
                               ("jobs/s", "jobs_s", 0)):
        rows.append([label, *(f"{sides[side][key]:.{digits}f}" for side in ("gpulanes", "plain"))])
    print(markdown_table(["Redis command per job", "gpulanes", "plain Celery"], rows))
    for what, ratio, goal, met in (
            ("commands Redis ran per job", figures["commands_ratio"], GOAL_COMMANDS,
             figures["commands_ratio"] <= GOAL_COMMANDS),
            ("commands sent per job", figures["sent_ratio"], GOAL_COMMANDS,
             figures["sent_ratio"] <= GOAL_COMMANDS),
            ("jobs/s", figures["rate_ratio"], GOAL_RATE, figures["rate_ratio"] >= GOAL_RATE)):
        bound = "<=" if what != "jobs/s" else ">="
        print(f"{what}: {ratio:.2f}x plain (goal {bound} {goal:g}x: "
              f"{'met' if met else 'NOT met'})")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python benchmarks/perjob.py", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--jobs", type=int, default=100, help="jobs per side (default: 100)")
    json_option(parser, "perjob")
    args = parser.parse_args(argv)
    figures = run_private("gl-perjob-", lambda state: benchmark(args, state),
                          "Redis is stopped", HEARTBEAT_S=1,
                          MODELS="demo=gpu_worker.demo_model:load,echo=tasks.models.echo:Echo",
                          WARM_MODELS="echo")
    return finish(figures, report, args.json)


if __name__ == "__main__":
    sys.exit(main())
