"""gpulanes' side of ``benchmarks/overload.py``: the beat that runs for its trials
alone, the depth of its lanes, and what each process spends on the CPU."""
from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from benchmarks.overload_plan import Budgets


class Beat:
    """One ``celery beat`` process with the budgets; a fresh snapshot each start."""

    def __init__(self, cluster: Any, budgets: Budgets, log_dir: Path) -> None:
        self.env = {**cluster.env, **budgets.env()}
        self.log_dir = log_dir
        self.process: subprocess.Popen | None = None
        self.client = cluster.redis.client()

    def start(self) -> None:
        """Start beat on an empty snapshot and wait until this process routes from its own."""
        from gpu_worker.processes import spawn
        from tasks.broker.keys import SNAPSHOT_KEY, WORKERS_KEY

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
            return proc_cpu_s(self.process.pid)
        except (OSError, AttributeError, IndexError):
            return 0.0

    def stop(self) -> None:
        """Terminate beat (kill it after 10 s); a no-op when it is not running."""
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        self.process = None


def proc_cpu_s(pid: int) -> float:
    """CPU seconds one process has used so far, user and system (Linux ``/proc``)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def tree_cpu_s(pids: list[int]) -> float:
    """CPU seconds used so far by ``pids`` and every process below them (Linux
    ``/proc``; 0 elsewhere)."""
    total, seen, todo = 0.0, set(), list(pids)
    while todo:
        pid = todo.pop()
        if pid in seen:
            continue
        seen.add(pid)
        try:
            total += proc_cpu_s(pid)
            for task in Path(f"/proc/{pid}/task").iterdir():
                todo += [int(c) for c in (task / "children").read_text().split()]
        except (OSError, IndexError, ValueError):
            continue
    return total


def redis_cpu_s(client: Any) -> float:
    """CPU seconds the Redis server has used so far, its forks (AOF rewrites) included
    (``INFO cpu``)."""
    info = client.info("cpu")
    return sum(float(info[f"used_cpu_{kind}"]) for kind in
               ("user", "sys", "user_children", "sys_children"))


def wait_for_live_view(client: Any, since: float, process: subprocess.Popen,
                       timeout_s: float = 60) -> None:
    """Block until this process routes from a snapshot beat wrote after ``since``."""
    from tasks.broker.view import snapshot_cache
    from tasks.broker.keys import SNAPSHOT_KEY

    deadline = time.monotonic() + timeout_s
    while not client.exists(SNAPSHOT_KEY) or (view := snapshot_cache().view()) is None \
            or view.at < since:
        if process.poll() is not None or time.monotonic() > deadline:
            raise RuntimeError("beat wrote no snapshot; see logs/beat.log")
        time.sleep(0.1)


def lanes_depth(client: Any) -> int:
    """Jobs waiting in all lanes together."""
    from beat.heartbeat import lane_depths

    return sum(lane_depths(client).values())
