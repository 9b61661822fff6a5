"""What the load soak watches while it runs, and how it learns what became of each job.

:class:`Probe` samples, every ``period_s`` in a thread of the driving
process: Redis ``used_memory``, the depth of each lane (shared lanes and
every worker's own queues, all priority levels) and the resident memory of
the cluster's processes. :func:`collect` reads the stored results of a list
of job ids straight from the result backend's keys (one ``MGET`` per
thousand ids; no pub/sub subscription per job) until every one is there or
the deadline passes.
"""
from __future__ import annotations

import json
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Iterable, Mapping

from tests.soak.load_submit import status_kb


def process_tree(root_pid: int, root_name: str) -> dict[str, int]:
    """``{name: pid}`` of ``root_pid`` and its descendants; a Celery worker is named
    by its node name (``--hostname gpu0@host`` -> ``gpu0``). Needs psutil for descendants."""
    try:
        import psutil
    except ImportError:
        return {root_name: root_pid}
    try:
        root = psutil.Process(root_pid)
        procs = [root, *root.children(recursive=True)]
    except psutil.Error:
        return {}
    named = {}
    for proc in procs:
        try:
            args = proc.cmdline()
        except psutil.Error:
            continue
        node = args[args.index("--hostname") + 1].split("@")[0] \
            if "--hostname" in args[:-1] else None
        named[root_name if proc.pid == root_pid else node or f"pid{proc.pid}"] = proc.pid
    return named


def lane_depths(client: Any, nodes: Iterable[str]) -> dict[str, int]:
    """Queued jobs per lane, worker queues and priority levels included."""
    from routing.names import LANES, worker_queue
    from tasks.broker.keys import lane_keys

    queues = [(lane, lane) for lane in LANES] + [
        (lane, worker_queue(lane, node)) for node in nodes for lane in LANES]
    with client.pipeline(transaction=False) as pipe:
        for _, queue in queues:
            for key in lane_keys(queue):
                pipe.llen(key)
        counts = iter(pipe.execute())
    depths = dict.fromkeys(LANES, 0)
    for lane, queue in queues:
        depths[lane] += sum(next(counts) for _ in lane_keys(queue))
    return depths


@dataclass
class Sample:
    at: float
    used_memory: int
    depths: dict[str, int]
    rss_kb: dict[str, int]


@dataclass
class Probe:
    """Samples Redis and the named processes until :meth:`stop`."""

    client: Any
    nodes: list[str]
    pids: Mapping[str, int]
    period_s: float = 0.5
    samples: list[Sample] = field(default_factory=list)
    message_bytes: list[int] = field(default_factory=list)

    def __post_init__(self) -> None:
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="soak-probe", daemon=True)

    def start(self) -> "Probe":
        self.sample()
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()
        self.sample()

    def _loop(self) -> None:
        while not self._stop.wait(self.period_s):
            self.sample()

    def sample(self) -> None:
        depths = lane_depths(self.client, self.nodes)
        used = int(self.client.info("memory")["used_memory"])
        rss = {name: status_kb(pid, "VmRSS") for name, pid in self.pids.items()}
        self.samples.append(Sample(time.monotonic(), used, depths, rss))
        if len(self.message_bytes) < 50:
            self._measure_messages()

    def _measure_messages(self) -> None:
        """Sizes of a few queued messages, from whichever lane holds some."""
        from routing.names import LANES, worker_queue

        for lane in LANES:
            for queue in [lane, *(worker_queue(lane, node) for node in self.nodes)]:
                self.message_bytes += [len(raw) for raw in self.client.lrange(queue, 0, 4)]

    def window(self, began: float, ended: float) -> list[Sample]:
        return [s for s in self.samples if began <= s.at <= ended]


@dataclass
class Fate:
    """What became of the accepted jobs by the deadline."""

    results: dict[str, dict] = field(default_factory=dict)  # job id -> result dict
    failed: dict[str, str] = field(default_factory=dict)  # job id -> state
    missing: list[str] = field(default_factory=list)
    waited_s: float = 0.0


def _read(app: Any, client: Any, ids: list[str], fate: Fate) -> list[str]:
    """Sort the ids whose result is stored into ``fate``; return those still pending."""
    backend, pending = app.backend, []
    for start in range(0, len(ids), 1000):
        chunk = ids[start:start + 1000]
        raws = client.mget([backend.get_key_for_task(i) for i in chunk])
        for job_id, raw in zip(chunk, raws):
            meta = json.loads(raw) if raw else None
            if meta is None or meta["status"] not in ("SUCCESS", "FAILURE", "REVOKED"):
                pending.append(job_id)
            elif meta["status"] == "SUCCESS":
                fate.results[job_id] = meta["result"]
            else:
                fate.failed[job_id] = meta["status"]
    return pending


def collect(app: Any, client: Any, ids: list[str], deadline_s: float,
            poll_s: float = 1.0) -> Fate:
    """Wait until every job in ``ids`` has a stored outcome, at most ``deadline_s``."""
    fate, began = Fate(), time.monotonic()
    pending = _read(app, client, ids, fate)
    while pending and time.monotonic() - began < deadline_s:
        time.sleep(poll_s)
        pending = _read(app, client, pending, fate)
    fate.missing, fate.waited_s = pending, time.monotonic() - began
    return fate
