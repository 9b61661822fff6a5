"""The supervisor restarts crashed workers, but gives up on one whose models
cannot load (exit 78), and exits 78 itself once no worker is left.

The children are real processes that exit at once with a given code; the
backoff is shortened so that each test takes about a second at most.
"""
from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable

import pytest

from gpu_worker import launcher
from gpu_worker.launcher import CONFIG_FAILURES_ALLOWED, Child, Supervisor


@pytest.fixture(autouse=True)
def clean_redis():
    """These tests use no Redis: skip conftest's per-test cleanup (and its broker)."""


@pytest.fixture(autouse=True)
def quick_backoff(monkeypatch):
    monkeypatch.setattr(launcher, "RESTART_BACKOFF_S", (0.01, 0.02, 0.05))
    # run() installs its own handlers; put pytest's back.
    saved = {sig: signal.getsignal(sig) for sig in (signal.SIGTERM, signal.SIGINT)}
    yield
    for sig, handler in saved.items():
        signal.signal(sig, handler)


@pytest.fixture
def spawned(monkeypatch) -> dict[int, list[subprocess.Popen]]:
    """Every process the supervisor starts, by child index, in order."""
    started: dict[int, list[subprocess.Popen]] = {}
    real_spawn = launcher.spawn

    def spawn(command: list[str], **kwargs) -> subprocess.Popen:
        process = real_spawn(command, **kwargs)
        started.setdefault(int(command[-1]), []).append(process)
        return process

    monkeypatch.setattr(launcher, "spawn", spawn)
    return started


def _child(index: int, code: int) -> Child:
    # The trailing argument is the index, for the ``spawned`` fixture.
    command = [sys.executable, "-c", f"raise SystemExit({code})", str(index)]
    return Child(index, command, dict(os.environ))


def _run(supervisor: Supervisor, stop_when: Callable[[], bool],
         timeout_s: float = 10.0) -> int:
    """``supervisor.run()`` here (it sets signal handlers: main thread only), stopped
    as SIGTERM would once ``stop_when()`` holds, or at the timeout."""
    done = threading.Event()

    def stopper() -> None:
        deadline = time.monotonic() + timeout_s
        try:
            while not (stop_when() or time.monotonic() > deadline):
                if done.wait(0.01):  # run() returned
                    break
        finally:  # even if stop_when() raised: a failing test must not hang
            supervisor.stopping = True

    thread = threading.Thread(target=stopper, daemon=True)
    thread.start()
    try:
        return supervisor.run()
    finally:
        done.set()
        thread.join()


def _never() -> bool:
    return False


def test_worker_that_cannot_load_its_models_is_given_up_and_the_supervisor_exits_78(
        spawned, caplog):
    supervisor = Supervisor([_child(0, 78)], stop_timeout_s=5, poll_s=0.01)
    with caplog.at_level(logging.INFO, logger="gpu_worker"):
        code = _run(supervisor, stop_when=_never)  # only giving up (or the timeout) ends it
    assert code == 78
    assert len(spawned[0]) == CONFIG_FAILURES_ALLOWED
    assert [p.wait(5) for p in spawned[0]] == [78] * CONFIG_FAILURES_ALLOWED
    errors = [r.getMessage() for r in caplog.records if r.levelno == logging.ERROR]
    assert any(f"gpu0 exited with 78 (EX_CONFIG) {CONFIG_FAILURES_ALLOWED} times" in m
               and "models could not load" in m and "GPULANES_WARM_MODELS" in m
               and "Not restarting it" in m for m in errors), errors
    assert "supervisor exits 78" in errors[-1]


def test_a_slow_load_that_fails_is_given_up_too(spawned, monkeypatch):
    # Every run counts as stable: a long load must not forgive a configuration error.
    monkeypatch.setattr(launcher, "STABLE_AFTER_S", 0.0)
    supervisor = Supervisor([_child(0, 78)], stop_timeout_s=5, poll_s=0.01)
    assert _run(supervisor, stop_when=_never) == 78
    assert len(spawned[0]) == CONFIG_FAILURES_ALLOWED


def test_crashing_worker_is_still_restarted_past_the_bound(spawned, caplog):
    supervisor = Supervisor([_child(0, 1)], stop_timeout_s=5, poll_s=0.01)
    wanted = CONFIG_FAILURES_ALLOWED + 2
    with caplog.at_level(logging.WARNING, logger="gpu_worker"):
        code = _run(supervisor, stop_when=lambda: len(spawned.get(0, ())) >= wanted)
    assert len(spawned[0]) >= wanted
    assert code == 0  # stopped as by SIGTERM, as before
    assert not supervisor.children[0].given_up
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR]


def test_supervisor_keeps_running_while_one_worker_is_left(spawned):
    supervisor = Supervisor([_child(0, 78), _child(1, 1)], stop_timeout_s=5, poll_s=0.01)
    wanted = CONFIG_FAILURES_ALLOWED + 2
    code = _run(supervisor, stop_when=lambda: supervisor.children[0].given_up
                and len(spawned.get(1, ())) >= wanted)
    assert supervisor.children[0].given_up and not supervisor.children[1].given_up
    assert len(spawned[0]) == CONFIG_FAILURES_ALLOWED
    assert len(spawned[1]) >= wanted
    assert code == 0  # SIGTERM's exit code is unchanged by a worker given up
