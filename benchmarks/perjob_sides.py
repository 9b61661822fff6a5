"""The two sides ``benchmarks/perjob.py`` measures, each a worker and its caller:
gpulanes' (a ``LocalCluster`` worker, ``submit()`` in the benchmark's process) and a
default Celery app's (``benchmarks/perjob_plain.py``: its worker and its caller, each
a process of its own)."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterator

ROOT = Path(__file__).resolve().parent.parent
SETTLE_S = 0.3  #: a round's wait after its last result: late acks and events land in it
#: The settings of the private cluster both sides run on (``run_private``'s): the echo
#: model warm.
ECHO_SETTINGS = {"HEARTBEAT_S": "1", "WARM_MODELS": "echo",
                 "MODELS": "demo=gpu_worker.demo_model:load,echo=tasks.models.echo:Echo"}


@dataclass
class Side:
    """A worker (``worker_pid``; ``root_pid``: the root of its processes) and its caller."""

    name: str
    worker_pid: int
    root_pid: int
    caller: Any  # send(jobs) -> ids, fetch(), pickup() -> seconds
    db: int = 0  #: the Redis database of its results

    def run(self, jobs: int) -> None:
        """``jobs`` jobs end to end: sent, then each ``.get()``, then a settle."""
        self.caller.send(jobs)
        self.caller.fetch()
        time.sleep(SETTLE_S)


class GpulanesCaller:
    """A gpulanes caller: ``submit(model="echo")`` and ``.get()``, in this process."""

    def __init__(self) -> None:
        from tasks import submit

        self.submit, self.sent = submit, []

    def send(self, jobs: int) -> list[str]:
        self.sent = [self.submit(model="echo", text=f"job {i}", tier="standard")
                     for i in range(jobs)]
        return [result.id for result in self.sent]

    def fetch(self) -> None:
        for result in self.sent:
            result.get(timeout=60)

    def pickup(self) -> float:
        began = time.time()
        return self.submit(model="echo", text="pickup", tier="standard").get(
            timeout=60)["started_at"] - began


class PlainCaller:
    """The plain caller's process (``python -m benchmarks.perjob_plain``), command by
    command: the same methods as :class:`GpulanesCaller`."""

    def __init__(self, env: dict[str, str], log: Path) -> None:
        self.log = log
        with open(log, "ab") as err:
            self.process = subprocess.Popen(
                [sys.executable, "-m", "benchmarks.perjob_plain"], env=env, cwd=ROOT,
                stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=err, text=True)

    def __call__(self, *command: Any) -> Any:
        self.process.stdin.write(json.dumps(command) + "\n")
        self.process.stdin.flush()
        line = self.process.stdout.readline()
        if not line:
            raise SystemExit(f"benchmarks/perjob.py: the plain caller exited; see {self.log}")
        return json.loads(line)

    def __getattr__(self, name: str) -> Callable[..., Any]:
        """``send``, ``fetch``, ``pickup``: those of :class:`GpulanesCaller`."""
        if name.startswith("_"):
            raise AttributeError(name)
        return lambda *args: self(name, *args)

    def close(self) -> None:
        self.process.stdin.close()
        self.process.wait(30)


@contextmanager
def gpulanes_side(state: Path) -> Iterator[Side]:
    """A gpulanes worker on the Redis serving ``state`` (its supervisor the root), and
    this process as its caller."""
    from tasks import app
    from tasks.dev.cluster import LocalCluster
    from tests.harness.faults import worker_pids

    cluster = LocalCluster(state, workers=1, device="cpu", beat=False,
                           log_dir=state / "logs").start(app, timeout_s=300)
    try:
        (pid,) = worker_pids(app, 1).values()
        yield Side("gpulanes", pid, cluster.supervisor.pid, GpulanesCaller())
    finally:
        cluster.stop()


@contextmanager
def plain_side(state: Path) -> Iterator[Side]:
    """The plain worker and its caller, each a process, on a database of their own."""
    from benchmarks.plain_run import PLAIN_DB, plain_url
    from tasks.settings import settings

    env = {**os.environ, "PERJOB_BROKER_URL": plain_url(settings.broker_url),
           "PYTHONPATH": str(ROOT)}
    with open(state / "plain-worker.log", "ab") as log:
        worker = subprocess.Popen(
            [sys.executable, "-m", "celery", "-A", "benchmarks.perjob_plain", "worker",
             "--pool", "threads", "-c", "1", "-E", "-Q", "standard", "-n", "plain@%h",
             "--loglevel", "WARNING"], env=env, cwd=ROOT, stdout=log,
            stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
    caller = None
    try:
        caller = PlainCaller(env, state / "plain-caller.log")
        if not caller("ready", 120):
            raise SystemExit("benchmarks/perjob.py: the plain worker did not answer; "
                             f"see {state / 'plain-worker.log'}")
        yield Side("plain", worker.pid, worker.pid, caller, db=PLAIN_DB)
    finally:
        if caller is not None:
            caller.close()
        worker.terminate()
        worker.wait(30)


def on_both_sides(state: Path, measure: Callable[[Any, list[Side]], dict[str, Any]],
                  warm_jobs: int = 1) -> dict[str, Any]:
    """``measure(client, sides)`` on an embedded Redis serving both sides, each warmed by
    ``warm_jobs`` jobs (connections made, code paths taken)."""
    from gpu_worker.redis_server import EmbeddedRedis

    server = EmbeddedRedis(state).start()
    try:
        with ExitStack() as stack:
            sides = [stack.enter_context(gpulanes_side(state)),
                     stack.enter_context(plain_side(state))]
            for side in sides:
                side.run(warm_jobs)
            return measure(server.client(), sides)
    finally:
        server.stop()
