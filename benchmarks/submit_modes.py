"""The ways ``benchmarks/submit.py`` publishes, each in a process of its own: gpulanes'
``submit()`` (without a seed, with one, a class model) and a plain Celery app's
``apply_async``, which never imports gpulanes. A mode's process publishes the batches
it is sent and answers their wall and CPU seconds."""
from __future__ import annotations

import time
from typing import Any, Callable

from benchmarks.common import PROMPT, TIERS, JobSize, plain_kwargs, stop_processes

MODES = ("submit", "submit_seeded", "submit_echo", "plain")
ACCOUNT = "bench"
SIZE = JobSize(steps=20, size=256)


def send_submit(i: int) -> Any:
    """Publish job ``i`` through gpulanes' ``submit()``, without a seed."""
    from tasks.api import submit

    return submit(PROMPT, tier=TIERS[i % 3], account=ACCOUNT,
                  steps=SIZE.steps, width=SIZE.size, height=SIZE.size)


def send_seeded(i: int) -> Any:
    """Publish job ``i`` through ``submit()`` with ``seed=i`` (claimed in the cache)."""
    from tasks.api import submit

    return submit(PROMPT, tier=TIERS[i % 3], account=ACCOUNT, seed=i,
                  steps=SIZE.steps, width=SIZE.size, height=SIZE.size)


def send_echo(i: int) -> Any:
    """Publish job ``i`` of ``echo``, a class model: its inputs checked by pydantic."""
    from tasks.api import submit

    return submit(model="echo", text=f"{PROMPT} {i}", tier=TIERS[i % 3], account=ACCOUNT)


def plain_sender(url: str) -> Callable[[int], Any]:
    """A plain Celery user's publish: a default app on ``url``, a task of the same name,
    kwargs of the same shape, queue = tier. Never imports gpulanes."""
    from celery import Celery

    plain = Celery("plain", broker=url, backend=url)

    @plain.task(name="gpulanes.run_job")  # routing.names.JOB_TASK
    def generate(**kwargs: Any) -> None:  # never runs here: nothing consumes
        return None

    def send(i: int) -> Any:
        tier = TIERS[i % 3]
        return generate.apply_async(kwargs=plain_kwargs(PROMPT, tier, ACCOUNT, i, SIZE),
                                    queue=tier)
    return send


def assert_live_view() -> None:
    """Fail loudly if ``submit()`` would route by tier only (stale or missing snapshot)."""
    from tasks.broker.view import snapshot_cache

    if snapshot_cache().view() is None:
        raise SystemExit("benchmarks/submit.py: submit() sees no fresh snapshot; "
                         "the measurement would skip decide()")


def timed_batch(send: Callable[[int], Any], first: int, n: int) -> tuple[float, float]:
    """(wall s, this process's CPU s) to publish ``n`` jobs; results kept until the clocks stop."""
    kept = []
    began, cpu = time.perf_counter(), time.process_time()
    for i in range(first, first + n):
        kept.append(send(i))
    elapsed, cpu = time.perf_counter() - began, time.process_time() - cpu
    del kept  # unsubscribing from the results happens here, off the clock
    return elapsed, cpu


def publisher(mode: str, url: str, conn: Any) -> None:
    """A mode's process: publish each batch ``(first, n)`` it is sent, answer its
    (wall s, CPU s); None ends it. An error is answered as its text."""
    try:
        if mode == "plain":
            send, check = plain_sender(url), lambda: None
        else:
            send = {"submit": send_submit, "submit_seeded": send_seeded,
                    "submit_echo": send_echo}[mode]
            check = assert_live_view
        while (batch := conn.recv()) is not None:
            check()
            conn.send(timed_batch(send, *batch))
    except BaseException as exc:  # noqa: BLE001  told to the parent, which stops
        conn.send(f"{mode}: {type(exc).__name__}: {exc}")


class Publishers:
    """One process per mode (``multiprocessing``'s spawn: a fresh interpreter each)."""

    def __init__(self, url: str) -> None:
        import multiprocessing

        context = multiprocessing.get_context("spawn")
        self.conns, self.processes = {}, []
        for mode in MODES:
            mine, theirs = context.Pipe()
            process = context.Process(target=publisher, args=(mode, url, theirs),
                                      name=f"publish-{mode}", daemon=True)
            process.start()
            self.conns[mode] = mine
            self.processes.append(process)

    def batch(self, mode: str, first: int, n: int) -> tuple[float, float]:
        self.conns[mode].send((first, n))
        answer = self.conns[mode].recv()
        if isinstance(answer, str):
            raise SystemExit(f"benchmarks/submit.py: {answer}")
        return answer

    def stop(self) -> None:
        stop_processes(self.conns.values(), self.processes)
