"""Running the plain Celery side of a benchmark: its workers and its publisher, each in
processes of their own, as a plain user runs them.

:class:`PlainWorkers` starts ``celery -A benchmarks.plain_app worker`` processes (the
same pool and concurrency as gpulanes' workers: threads, one; ``-E``; every other
option at Celery's default) and waits until each answers a ping. :class:`PlainClient`
is one fresh interpreter (``multiprocessing``'s spawn) that publishes and waits for
results through the plain app only: the benchmark hands it a function of a module that
imports no gpulanes client code, and each call checks afterwards that it stayed plain.
"""
from __future__ import annotations

import os
import subprocess
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any, Callable

from benchmarks.common import ROOT

PLAIN_DB = 1  # the plain side's Redis database: none of its keys meet gpulanes'


def plain_url(gpulanes_url: str) -> str:
    """The URL of database ``PLAIN_DB`` on gpulanes' Redis (a ``redis+socket://`` URL)."""
    return f"{gpulanes_url.split('?')[0]}?virtual_host={PLAIN_DB}"


def plain_env(url: str, state: Path, **extra: str) -> dict[str, str]:
    """The plain side's environment: its broker, model and artifact folders, and
    ``extra`` by name without the ``PLAIN_`` prefix (``WARM_MODELS``, ``MODEL_SLOTS``)."""
    return {"PLAIN_BROKER_URL": url, "PLAIN_MODEL_DIR": str(state / "plain-models"),
            "PLAIN_ARTIFACT_DIR": str(state / "plain-artifacts"),
            **{f"PLAIN_{name}": str(value) for name, value in extra.items()}}


class PlainWorkers:
    """``count`` plain worker processes; ``with PlainWorkers(...):`` stops them on exit."""

    def __init__(self, count: int, env: dict[str, str], log_dir: Path) -> None:
        self.count, self.log_dir = count, log_dir
        self.env = {**os.environ, **env,
                    "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT),
                                                                os.environ.get("PYTHONPATH")]))}
        self.processes: list[subprocess.Popen] = []

    def start(self, timeout_s: float = 180.0) -> "PlainWorkers":
        """Start the workers; return once every one answers (its models loaded)."""
        self.log_dir.mkdir(parents=True, exist_ok=True)
        for i in range(self.count):
            with open(self.log_dir / f"plain-worker-{i}.log", "ab") as log:
                self.processes.append(subprocess.Popen(
                    [sys.executable, "-m", "celery", "-A", "benchmarks.plain_app", "worker",
                     "--pool", "threads", "-c", "1", "-E", "-Q", "fast,standard,relaxed",
                     "-n", f"plain{i}@%h", "--loglevel", "WARNING"],
                    env=self.env, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT,
                    stdin=subprocess.DEVNULL))
        self._wait(timeout_s)
        return self

    def _wait(self, timeout_s: float) -> None:
        from celery import Celery

        control = Celery("plain-control", broker=self.env["PLAIN_BROKER_URL"],
                         set_as_current=False)
        deadline, seen = time.monotonic() + timeout_s, set()
        while len(seen) < self.count:
            if time.monotonic() > deadline or any(p.poll() is not None for p in self.processes):
                self.stop()
                raise SystemExit(f"plain workers did not all answer; see {self.log_dir}")
            seen |= {name for reply in control.control.ping(timeout=0.5) or [] for name in reply}

    def stop(self) -> None:
        """SIGTERM every worker (a warm shutdown), SIGKILL after 30 s."""
        for process in self.processes:
            process.terminate()
        for process in self.processes:
            try:
                process.wait(30)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
        self.processes = []

    def __enter__(self) -> "PlainWorkers":
        return self.start()

    def __exit__(self, *_: Any) -> None:
        self.stop()


def _enter(env: dict[str, str]) -> None:
    os.environ.update(env)


def _plain_call(fn: Callable[..., Any], args: tuple) -> Any:
    from benchmarks.plain_app import check_plain

    answer = fn(*args)
    check_plain(f"the plain publisher ({fn.__module__}.{fn.__name__})")
    return answer


class PlainClient:
    """One spawned process running the plain side's publishing, call by call."""

    def __init__(self, env: dict[str, str]) -> None:
        import multiprocessing

        self.pool = ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("spawn"),
                                        initializer=_enter, initargs=(env,))

    def call(self, fn: Callable[..., Any], *args: Any) -> Any:
        """``fn(*args)`` in the plain process; its answer (pickled back)."""
        return self.pool.submit(_plain_call, fn, args).result()

    def __enter__(self) -> "PlainClient":
        return self

    def __exit__(self, *_: Any) -> None:
        self.pool.shutdown(cancel_futures=True)
