"""The supervisor: one Celery worker process per device, restarted if it crashes.

``python -m gpu_worker --workers N --device auto|cpu|cuda``. SIGTERM (or
Ctrl-C) asks every worker for a warm shutdown: each finishes the job it holds,
and kombu puts back anything it had reserved.

A worker whose models cannot load, or whose Redis may evict keys, exits with 78
(EX_CONFIG). Restarting it cannot help, so after ``CONFIG_FAILURES_ALLOWED`` such
exits in a row the supervisor gives up on it; once it has given up on every worker it exits 78
itself, so systemd or Docker see a configuration error, not a crash loop.
"""
from __future__ import annotations

import logging
import os
import re
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass

from gpu_worker.processes import spawn
from routing.names import worker_hostname, worker_queues

log = logging.getLogger("gpu_worker")
RESTART_BACKOFF_S = (1.0, 2.0, 5.0, 10.0, 30.0)
#: A worker up this long has its crash count forgiven.
STABLE_AFTER_S = 60.0
#: ``gpu_worker.hooks.EXIT_NOT_WARM``, repeated: importing hooks here would pull
#: Celery and torch into the supervisor.
EXIT_CONFIG = 78
#: Exits with EXIT_CONFIG in a row before giving up on a worker: a few, not one,
#: as a model store on a network mount may come up late.
CONFIG_FAILURES_ALLOWED = 3


#: What ``--instance`` may be: it goes into node and queue names (no ``@``, ``.`` or ``,``).
INSTANCE = re.compile(r"[A-Za-z0-9][A-Za-z0-9_-]{0,31}")


def worker_node(index: int, instance: str | None = None) -> str:
    """Celery node name of device ``index`` on this host: ``gpu0@host``, or ``gpu0-a@host``
    for the supervisor ``--instance a``, so that several supervisors share a host."""
    name = worker_hostname(index)
    if instance:
        name = name.replace("@", f"-{instance}@", 1)
    return name.replace("%h", socket.gethostname())


def worker_command(index: int, concurrency: int, loglevel: str,
                   instance: str | None = None) -> list[str]:
    """The ``celery worker`` command line of device ``index``."""
    node = worker_node(index, instance)
    return [sys.executable, "-m", "celery", "-A", "tasks", "worker",
            "--pool", "threads", "--concurrency", str(concurrency),
            # priority order: its own fast queue, fast, its own standard, standard, ...
            "--queues", ",".join(worker_queues(node)),
            "--hostname", node, "--events",
            "--without-mingle", "--without-gossip", "--loglevel", loglevel]


#: glibc's malloc in each worker keeps the memory a job frees for the next job. By
#: default it maps every block over 128 KiB afresh and unmaps it when freed, so each
#: job faults its buffers in again page by page, zeroed (about 690 page faults a demo
#: job of 16 steps at 128 px); with these, none. Blocks up to 32 MiB (glibc's most) come
#: from the heap, and up to 256 MiB of free heap is kept rather than handed back. An
#: operator's own values in the environment win; other C libraries ignore them.
MALLOC_ENV = {"MALLOC_MMAP_THRESHOLD_": str(32 << 20), "MALLOC_TRIM_THRESHOLD_": str(256 << 20)}


def worker_env(index: int, device: str) -> dict[str, str]:
    """Pin the worker: on CUDA it sees exactly one GPU, which it calls cuda:0.

    Index ``i`` means the i-th GPU this supervisor sees, so an operator's own
    ``CUDA_VISIBLE_DEVICES`` (ids or UUIDs) is narrowed, not overridden. The worker's
    malloc keeps freed memory for the next job (:data:`MALLOC_ENV`).
    """
    env = {**MALLOC_ENV, **os.environ}
    if device == "cuda":
        mask = [d.strip() for d in env.get("CUDA_VISIBLE_DEVICES", "").split(",") if d.strip()]
        env["CUDA_VISIBLE_DEVICES"] = mask[index] if mask else str(index)
        env["GPULANES_WORKER_DEVICE"] = "cuda:0"
    else:
        env["GPULANES_WORKER_DEVICE"] = "cpu"
    return env


@dataclass
class Child:
    index: int
    command: list[str]
    env: dict[str, str]
    cpus: set[int] | None = None  # the GPU's NUMA node, where the host reports it
    process: subprocess.Popen | None = None
    started_at: float = 0.0
    crashes: int = 0
    restart_at: float = 0.0
    config_failures: int = 0
    given_up: bool = False
    name: str = ""  # in the log: its node name before the ``@`` (default ``gpu<index>``)

    def __post_init__(self) -> None:
        self.name = self.name or f"gpu{self.index}"

    def start(self) -> None:
        self.process = spawn(self.command, env=self.env, cpus=self.cpus)
        self.started_at = time.monotonic()
        bound = f", CPUs {sorted(self.cpus)}" if self.cpus else ""
        log.info("%s started (pid %d%s)", self.name, self.process.pid, bound)


@dataclass
class Supervisor:
    """Starts, watches and stops the workers; ``run()`` blocks until stopped."""

    children: list[Child]
    stop_timeout_s: float
    stopping: bool = False
    poll_s: float = 0.05  # how soon a SIGTERM is passed on, and an exit seen

    def run(self) -> int:
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, self._on_signal)
        for child in self.children:
            child.start()
        while not self.stopping and not self._all_given_up():
            self._watch(time.monotonic())
            time.sleep(self.poll_s)
        code = self._stop_all()
        if self._all_given_up():
            log.error("no worker left to run (all exited with %d); the supervisor exits %d",
                      EXIT_CONFIG, EXIT_CONFIG)
            return EXIT_CONFIG
        return code

    def _all_given_up(self) -> bool:
        return all(child.given_up for child in self.children)

    def _on_signal(self, signum: int, _frame: object) -> None:
        self.stopping = True

    def _watch(self, now: float) -> None:
        for child in self.children:
            code = child.process.poll() if child.process else None
            if child.process is not None and code is not None:
                self._schedule_restart(child, code, now)
            if child.process is None and not child.given_up and now >= child.restart_at:
                child.start()

    def _schedule_restart(self, child: Child, code: int, now: float) -> None:
        if now - child.started_at > STABLE_AFTER_S:
            child.crashes = 0
        # Exits with EXIT_CONFIG in a row count, however long each run was: loading
        # big models can outlast STABLE_AFTER_S and still fail. Any other exit got
        # past the check, or died before it, and says nothing about the configuration.
        child.config_failures = child.config_failures + 1 if code == EXIT_CONFIG else 0
        child.process = None
        if child.config_failures >= CONFIG_FAILURES_ALLOWED:
            self._give_up(child)
            return
        # Exits with EXIT_CONFIG back off like crashes: one table, one counter.
        delay = RESTART_BACKOFF_S[min(child.crashes, len(RESTART_BACKOFF_S) - 1)]
        child.crashes += 1
        child.restart_at = now + delay
        why = " (a configuration error: its models, or Redis' maxmemory-policy)" \
            if code == EXIT_CONFIG else ""
        log.warning("%s exited with %s%s; restarting in %.0fs",
                    child.name, code, why, delay)

    def _give_up(self, child: Child) -> None:
        """Stop restarting ``child``: its configuration, not luck, keeps it down."""
        child.given_up = True
        log.error("%s exited with %d (EX_CONFIG) %d times in a row: its models could not "
                  "load, or Redis may evict keys. Not restarting it. Check GPULANES_MODELS / "
                  "GPULANES_WARM_MODELS / the model store (GPULANES_MODEL_DIR) and Redis' "
                  "maxmemory-policy (noeviction); see the worker's log above for the "
                  "error, fix it and restart `python -m gpu_worker`.",
                  child.name, EXIT_CONFIG, child.config_failures)

    def _stop_all(self) -> int:
        """Warm-stop every worker; 0 if all stopped in time, 1 if any was killed."""
        running = [c.process for c in self.children if c.process and c.process.poll() is None]
        for process in running:
            process.send_signal(signal.SIGTERM)
        deadline, killed = time.monotonic() + self.stop_timeout_s, 0
        for process in running:
            try:
                process.wait(max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                log.error("worker pid %d did not stop in time; killing it", process.pid)
                process.kill()
                process.wait()
                killed += 1
        log.info("all workers stopped%s", f" ({killed} killed)" if killed else "")
        return 1 if killed else 0
