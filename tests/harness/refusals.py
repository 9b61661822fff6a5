"""Redis that answers with a refusal, on a real cluster, every job counted.

Redis out of memory (``maxmemory`` lowered below what it uses, ``noeviction``) or
refusing every write because its disk fails (MISCONF) while ten jobs are in flight
on the workers: :func:`refusal_blip` counts what became of each job once Redis takes
writes again (done, failed, run to the end twice, seconds after Redis healed) and
what a submit met meanwhile. Shared by ``tests/test_refusals.py`` (short blips) and
the soak ``tests/soak/refusals.py`` (the full sizes). Jobs run on the test model
``tests.flaky_model`` (``pace:MS``: a job of a known length that reports every step),
whose runs are counted across processes.

Like the rest of ``tests.harness``, nothing here imports ``tasks`` at module level.
"""
from __future__ import annotations

import contextlib
import tempfile
import time
import uuid
from collections import Counter
from pathlib import Path
from typing import Any, Callable, ContextManager, Iterator

#: Ten jobs of 20 steps of 200 ms: four seconds each.
PACE_MS, STEPS = 200, 20
SMALL = dict(width=64, height=64)


@contextlib.contextmanager
def out_of_memory(client: Any) -> Iterator[None]:
    """Redis' ``maxmemory`` below what it uses: with ``noeviction`` it refuses every
    write that could grow it (OOM) until the limit is put back."""
    before = client.config_get("maxmemory")["maxmemory"]
    client.config_set("maxmemory", max(1, client.info("memory")["used_memory"] // 2))
    try:
        yield
    finally:
        client.config_set("maxmemory", before)


@contextlib.contextmanager
def disk_failing(client: Any) -> Iterator[None]:
    """Redis' snapshot fails (its folder is removed under it), so it refuses every
    write (MISCONF) until a snapshot succeeds again in its own folder."""
    folder, save = client.config_get("dir")["dir"], client.config_get("save")["save"]
    gone = Path(tempfile.mkdtemp(prefix="gl-gone-"))
    client.config_set("dir", str(gone))
    gone.rmdir()
    client.config_set("save", "3600 1")  # writes are refused only while snapshots are on
    _snapshot(client, "err")
    try:
        yield
    finally:
        client.config_set("dir", folder)
        _snapshot(client, "ok")
        client.config_set("save", save)


def _snapshot(client: Any, status: str, timeout_s: float = 30.0) -> None:
    """Take a snapshot (BGSAVE) and wait until it ended with ``status``."""
    deadline = time.monotonic() + timeout_s
    while _persistence(client)["rdb_bgsave_in_progress"]:
        time.sleep(0.05)
    client.bgsave()
    while time.monotonic() < deadline:
        found = _persistence(client)
        if not found["rdb_bgsave_in_progress"] and found["rdb_last_bgsave_status"] == status:
            return
        time.sleep(0.05)
    raise TimeoutError(f"Redis' snapshot did not end {status!r} in {timeout_s:.0f}s")


def _persistence(client: Any) -> dict[str, Any]:
    return client.info("persistence")


#: The refusals :func:`refusal_blip` knows, by name: what makes Redis refuse writes.
FAULTS: dict[str, Callable[[Any], ContextManager[None]]] = {
    "oom": out_of_memory, "misconf": disk_failing}


def _wait(predicate: Callable[[], bool], timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out waiting for {what}")
        time.sleep(0.05)


def refusal_blip(client: Any, fault: str, seconds: float, jobs: int = 10,
                 settle_s: float = 60.0) -> dict[str, Any]:
    """Start ``jobs`` jobs of four seconds, make Redis refuse writes (``fault``, of
    :data:`FAULTS`) for ``seconds`` once every one of them has begun, try a submit
    every half second meanwhile, then count what became of the jobs."""
    from tasks import submit
    from tasks.broker.memory import redis_state
    from tasks.errors import BrokerUnavailable
    from tests.flaky_model import runs_finished

    tag = uuid.uuid4().hex[:8]
    prompts = [f"pace:{PACE_MS} refusal {fault} {tag} {i}" for i in range(jobs)]
    results = [submit(p, model="flaky", seed=i, steps=STEPS, **SMALL)
               for i, p in enumerate(prompts)]
    _wait(lambda: all(r.state in ("STARTED", "PROGRESS") for r in results), 60,
          f"{jobs} jobs to begin")
    refusals: Counter[str] = Counter()
    with FAULTS[fault](client):
        shown = redis_state(client)["refusing"]  # what `lanes status` shows meanwhile
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            try:
                results.append(submit(f"during {fault} {tag}", model="flaky", seed=0,
                                      steps=1, **SMALL))
            except BrokerUnavailable as exc:
                refusals[f"{type(exc).__name__}({getattr(exc, 'code', '')})"] += 1
            time.sleep(0.5)
    healed, done_s = time.monotonic(), {}
    deadline = healed + settle_s
    while len(done_s) < len(results) and time.monotonic() < deadline:
        for result in results:
            if result.id not in done_s and result.ready():
                done_s[result.id] = time.monotonic() - healed
        time.sleep(0.05)
    states = Counter(r.state for r in results)
    return {"fault": fault, "seconds": seconds, "jobs": len(results),
            "accepted_during": len(results) - jobs, "refusals": dict(refusals),
            "status_shown": shown,
            "done": states["SUCCESS"], "failed": states["FAILURE"],
            "lost": len(results) - len(done_s),
            "latest_s": round(max(done_s.values(), default=float("inf")), 1),
            "ran_twice": sum(runs_finished(p, i) > 1 for i, p in enumerate(prompts)),
            "ran": sum(runs_finished(p, i) for i, p in enumerate(prompts))}
