"""Fault runs on a real cluster: stream jobs at it, break something, count every job.

Shared by ``tests/test_faults.py`` (small, quick), the soak ``tests/soak/faults.py``
(long) and ``benchmarks/failover.py``. A :class:`JobStream` submits jobs from a thread
and keeps each accepted job (``submit()`` returned an ``AsyncResult``) and each refusal
(it raised: never accepted). :func:`settle` then waits for every accepted job and counts:

- **completed**: its result came back (``.get()``, the client's own path);
- **failed**: it failed for good (dead-lettered);
- **falsely failed**: its caller saw FAILURE although a run of it stored a
  result (must be 0);
- **lost**: accepted, but no result by the deadline (must be 0);
- **re-run**: more than one run began (``attempts_key``, counted by every run
  in Redis): the first was killed, or failed and was retried;
- **duplicated**: more than one run *finished* (``DUPLICATES_KEY``, written by
  the task when a finished run finds an earlier result stored).

Like the rest of ``tests.harness``, nothing here imports ``tasks`` at module level.
"""
from __future__ import annotations

import json
import os
import random
import shutil
import signal
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable

TIERS = ("fast", "standard", "relaxed")
#: A few milliseconds per generation (tests/conftest.py's SMALL).
SMALL = dict(steps=4, width=64, height=64)
HEADERS = ("scenario", "submitted", "accepted", "refused", "completed", "failed",
           "falsely failed", "re-run", "duplicated", "lost", "seconds")


@dataclass
class Counts:
    """What became of the jobs of one fault run."""

    scenario: str
    submitted: int
    accepted: int
    refused: int
    completed: int
    failed: int
    rerun: int
    duplicated: int
    lost: int
    seconds: float
    refusals: dict[str, int] = field(default_factory=dict)
    lost_ids: list[str] = field(default_factory=list)
    falsely_failed: int = 0
    #: The longest a refused submit took to raise (seconds).
    slowest_refusal_s: float = 0.0

    def row(self) -> list[Any]:
        return [self.scenario, self.submitted, self.accepted, self.refused, self.completed,
                self.failed, self.falsely_failed, self.rerun, self.duplicated, self.lost,
                f"{self.seconds:.1f}"]


def small_job(index: int) -> dict[str, Any]:
    """Keyword arguments of ``submit()`` for job ``index``: tiers in turn, no seed
    (a drawn seed is never shared, so every job runs on the GPU itself)."""
    return {"prompt": f"fault stream {index}", "tier": TIERS[index % 3], **SMALL}


class JobStream:
    """Submit jobs in a background thread, at most ``rate_per_s``, until stopped."""

    def __init__(self, make_job: Callable[[int], dict[str, Any]] = small_job) -> None:
        self.make_job = make_job
        self.accepted: dict[str, Any] = {}  # job id -> AsyncResult
        self.refused: Counter[str] = Counter()
        self.refused_jobs: list[dict[str, Any]] = []  # the first hundred, to submit again
        self.slowest_refusal_s = 0.0
        self.submitted = 0
        self.started_at = time.monotonic()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def submit_one(self) -> Any | None:
        """Submit the next job; its ``AsyncResult``, or None when submit raised."""
        from tasks import submit

        index, self.submitted = self.submitted, self.submitted + 1
        began, job = time.monotonic(), self.make_job(index)
        try:
            result = submit(**job)
        except Exception as exc:  # noqa: BLE001  a refusal: counted, never accepted
            self.refused[type(exc).__name__] += 1
            if len(self.refused_jobs) < 100:
                self.refused_jobs.append(job)
            self.slowest_refusal_s = max(self.slowest_refusal_s, time.monotonic() - began)
            return None
        self.accepted[result.id] = result
        return result

    def start(self, rate_per_s: float, limit: int | None = None) -> "JobStream":
        self._thread = threading.Thread(target=self._run, args=(rate_per_s, limit),
                                        name="fault-stream", daemon=True)
        self._thread.start()
        return self

    def _run(self, rate_per_s: float, limit: int | None) -> None:
        period_s = 1.0 / rate_per_s
        next_at = time.monotonic()
        while not self._stop.is_set() and (limit is None or self.submitted < limit):
            self.submit_one()
            next_at += period_s
            self._stop.wait(max(0.0, next_at - time.monotonic()))  # pacing, not a wait on state

    def wait_for(self, submitted: int, timeout_s: float) -> None:
        """Block until ``submitted`` jobs have been offered (accepted or refused)."""
        deadline = time.monotonic() + timeout_s
        while self.submitted < submitted and time.monotonic() < deadline:
            self._stop.wait(0.02)

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()


def _outcome(result: Any, deadline: float) -> str:
    try:
        result.get(timeout=max(0.1, deadline - time.monotonic()), propagate=False)
    except Exception:  # noqa: BLE001  a timeout, or the backend unreachable to the end
        return "lost"
    return {"SUCCESS": "completed", "FAILURE": "failed"}.get(result.state, "lost")


def _runs(client: Any, job_ids: list[str]) -> list[int]:
    """Runs begun per job, from the counter every run of a job increments."""
    from tasks.broker.keys import attempts_key

    with client.pipeline(transaction=False) as pipe:
        for job_id in job_ids:
            pipe.get(attempts_key(job_id))
        return [int(value or 0) for value in pipe.execute()]


def wait_quiet(client: Any, job_ids: Iterable[str], timeout_s: float) -> None:
    """Wait until no run of these jobs holds a lease (a late duplicate has finished)."""
    from tasks.broker.keys import lease_key

    keys, deadline = [lease_key(job_id) for job_id in job_ids], time.monotonic() + timeout_s
    while keys and client.exists(*keys) and time.monotonic() < deadline:
        time.sleep(0.1)


def settle(stream: JobStream, scenario: str, client: Any, timeout_s: float) -> Counts:
    """Wait (up to ``timeout_s`` in all) for every accepted job and count the outcomes."""
    from tasks.broker.keys import DUPLICATES_KEY, done_key

    deadline = time.monotonic() + timeout_s
    outcomes = Counter(_outcome(r, deadline) for r in stream.accepted.values())
    if outcomes["lost"]:  # past the deadline each wait was short: read the states again
        again = time.monotonic() + 5.0  # in all, not per job: many lost jobs must not stall it
        outcomes = Counter(_outcome(r, again) for r in stream.accepted.values())
    ids = list(stream.accepted)
    wait_quiet(client, ids, max(1.0, deadline - time.monotonic()))
    duplicates = client.hmget(DUPLICATES_KEY, ids) if ids else []
    lost_ids = [i for i, r in stream.accepted.items() if r.state not in ("SUCCESS", "FAILURE")]
    false = [i for i, r in stream.accepted.items()
             if r.state == "FAILURE" and client.exists(done_key(i))]
    return Counts(scenario, stream.submitted, len(ids), sum(stream.refused.values()),
                  outcomes["completed"], outcomes["failed"],
                  sum(runs > 1 for runs in _runs(client, ids)),
                  sum(bool(d) for d in duplicates), outcomes["lost"],
                  time.monotonic() - stream.started_at, dict(stream.refused), lost_ids,
                  len(false), round(stream.slowest_refusal_s, 2))


# --- faults ----------------------------------------------------------------------------
def worker_pids(app: Any, expected: int, timeout_s: float = 60.0) -> dict[str, int]:
    """``{hostname: pid}`` once ``expected`` workers answer the heartbeat command."""
    from routing.names import STATS_COMMAND

    deadline = time.monotonic() + timeout_s
    while True:
        answers = app.control.broadcast(STATS_COMMAND, reply=True, timeout=0.5) or []
        pids = {host: reply["pid"] for answer in answers for host, reply in answer.items()}
        if len(pids) >= expected or time.monotonic() > deadline:
            return pids


def kill_a_worker(app: Any, expected: int, rng: random.Random) -> tuple[str, int]:
    """SIGKILL one of the cluster's workers, chosen by ``rng``; returns (host, pid)."""
    pids = worker_pids(app, expected)
    host = rng.choice(sorted(pids))
    os.kill(pids[host], signal.SIGKILL)
    return host, pids[host]


def wait_replaced(app: Any, host: str, old_pid: int, timeout_s: float = 90.0) -> bool:
    """Whether worker ``host`` answers again from a new process within ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        pid = worker_pids(app, 1, timeout_s=0).get(host)
        if pid is not None and pid != old_pid:
            return True
    return False


def kill_supervisor(cluster: Any) -> None:
    """SIGKILL the cluster's ``python -m gpu_worker`` supervisor (its workers live on)."""
    cluster.supervisor.kill()
    cluster.supervisor.wait()


def keep_evidence(state: Path, client: Any, job_ids: list[str]) -> Path:
    """Copy the cluster's logs out of ``state`` (removed at exit) and write what Redis
    holds of each lost job (every key naming it, the coalesced run it follows and its
    leader's keys, and every holder's record whose message names it) to
    ``evidence.json``; the folder's path."""
    from tasks.broker.keys import HELD_PREFIX, HOLDING_KEY, RUN_KEY_PREFIX, parse_entry

    kept = Path(f"/tmp/gl-soak-lost-{os.getpid()}-{int(time.time())}")
    kept.mkdir(parents=True, exist_ok=True)
    for log in state.glob("*.log"):
        shutil.copy(log, kept / log.name)
    # every holder's records, not only the registered holders': one missing from the set
    # is what beat would never give back
    held = list(client.scan_iter(match=f"{HELD_PREFIX}*", count=1000))
    evidence: dict[str, Any] = {}
    for job_id in job_ids:
        found: dict[str, Any] = {}
        for key in client.scan_iter(match=f"*{job_id}*", count=1000):
            kind = client.type(key).decode()
            found[key.decode()] = {"type": kind, "ttl": client.ttl(key), "value": (
                client.get(key) if kind == "string" else client.hgetall(key)
                if kind == "hash" else None)}
        for run in client.scan_iter(match=f"{RUN_KEY_PREFIX}*", count=1000):
            if client.hexists(run, f"f:{job_id}"):  # it follows a coalesced run
                found[f"follows {run.decode()}"] = {"run": client.hgetall(run), "leader": {
                    key.decode(): client.type(key).decode() for key in client.scan_iter(
                        match=f"*{run.decode()[len(RUN_KEY_PREFIX):]}*", count=1000)}}
        for key in held:
            holder = key.decode()[len(HELD_PREFIX):]
            for token, record in client.hscan_iter(key, count=1000):
                if job_id.encode() in record:
                    found[f"{key.decode()}[{token.decode()}]"] = {
                        "holder": holder, "list": parse_entry(record)[0],
                        "registered": bool(client.sismember(HOLDING_KEY, holder))}
        evidence[job_id] = found
    (kept / "evidence.json").write_text(json.dumps(_texts(evidence), indent=2) + "\n")
    return kept


def _texts(value: Any) -> Any:
    """``value`` with every bytes in it (dict keys too) decoded, for JSON."""
    if isinstance(value, bytes):
        return value.decode(errors="replace")
    if isinstance(value, dict):
        return {_texts(k): _texts(v) for k, v in value.items()}
    return value
