"""A failover seen from outside the cluster: who is primary, who is connected where, who leads.

:class:`Watcher` samples from a thread, every ``period_s``: the primary the
Sentinels name, each server's role, the beat leader and epoch recorded on each server
(``tasks.broker.leader.current``), and, for each process of the cluster by name
(``submitter``, ``beat``, ``beat2``, ``gpu0``...), the servers it holds an established
TCP connection to. The functions below read a run's figures from the samples, and
from the cluster's logs (beat's ``leads (epoch N)`` lines, errors, finished runs).
"""
from __future__ import annotations

import re
import subprocess
import sys
import threading
import time
import urllib.request
from collections import Counter
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any, Callable, Iterable

import psutil
import redis

from benchmarks.sentinels import SentinelTopology, quick_client
from routing.names import JOB_TASK_NAMES


@dataclass(frozen=True)
class Sample:
    """What the watcher saw at ``at`` (monotonic seconds)."""

    at: float
    master: int | None
    roles: dict[int, str | None]
    #: Per server: (the leading beat's identity or None, epoch); None: it did not answer.
    leaders: dict[int, tuple[str | None, int] | None]
    links: dict[str, frozenset[int]]


class Watcher:
    """Sample the topology and the cluster's connections from a daemon thread."""

    def __init__(self, topology: SentinelTopology, processes: Callable[[], dict[str, int]],
                 period_s: float = 0.25) -> None:
        self.topology, self.processes, self.period_s = topology, processes, period_s
        self.samples: list[Sample] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="failover-watch", daemon=True)

    def start(self) -> "Watcher":
        self._thread.start()
        return self

    def stop(self) -> list[Sample]:
        self._stop.set()
        self._thread.join()
        return self.samples

    def _run(self) -> None:
        while not self._stop.is_set():
            self.samples.append(self.sample())
            self._stop.wait(self.period_s)

    def sample(self) -> Sample:
        ports = list(self.topology.servers)
        at, master = time.monotonic(), self.topology.master_port()
        roles = {port: self.topology.role(port) for port in ports}
        return Sample(at, master, roles,
                      {port: _leader(port) if roles[port] else None for port in ports},
                      {name: _links(pid, ports) for name, pid in self.processes().items()})


class Operator:
    """What an operator's tools meet: the exporter, scraped every ``period_s`` from a
    thread (so that it reads Redis all along), and ``lanes status``, run again and again
    from the fault on (a process each) until one answers."""

    def __init__(self, exporter_port: int, period_s: float = 0.25) -> None:
        self.url = f"http://127.0.0.1:{exporter_port}/metrics"
        self.period_s = period_s
        self.scrapes: list[tuple[float, bool]] = []  # (monotonic, answered)
        self.statuses: list[tuple[float, float, bool]] = []  # (began, ended, answered)
        self._stop, self._fault = threading.Event(), threading.Event()
        self._threads = [threading.Thread(target=self._scrape, daemon=True),
                         threading.Thread(target=self._status, daemon=True)]

    def start(self) -> "Operator":
        for thread in self._threads:
            thread.start()
        return self

    def fault(self) -> None:
        self._fault.set()

    def stop(self) -> None:
        self._stop.set()
        self._fault.set()
        for thread in self._threads:
            thread.join()

    def _scrape(self) -> None:
        while not self._stop.wait(self.period_s):
            try:
                urllib.request.urlopen(self.url, timeout=5).read()
                self.scrapes.append((time.monotonic(), True))
            except OSError:
                self.scrapes.append((time.monotonic(), False))

    def _status(self) -> None:
        self._fault.wait()
        while not self._stop.is_set():
            began = time.monotonic()
            done = subprocess.run([sys.executable, "-m", "celery", "-A", "tasks", "lanes",
                                   "status", "--json"], capture_output=True, timeout=60)
            self.statuses.append((began, time.monotonic(), done.returncode == 0))


def _leader(port: int) -> Any:
    from tasks.broker import leader

    try:
        return leader.current(quick_client(port))
    except (redis.RedisError, OSError, ValueError):
        return None


def _links(pid: int, ports: Iterable[int]) -> frozenset[int]:
    """The servers (by port) process ``pid`` holds an established TCP connection to."""
    try:
        found = psutil.Process(pid).net_connections(kind="tcp")
    except (psutil.Error, OSError):
        return frozenset()
    wanted = set(ports)
    return frozenset(c.raddr.port for c in found if c.raddr and c.raddr.port in wanted
                     and c.status == psutil.CONN_ESTABLISHED)


def worker_processes(supervisor_pid: int) -> dict[str, int]:
    """``{"gpu0": pid, ...}``: the Celery workers under the supervisor, by hostname."""
    named = {}
    try:
        children = psutil.Process(supervisor_pid).children(recursive=True)
    except psutil.Error:
        return {}
    for child in children:
        try:
            args = child.cmdline()
        except psutil.Error:
            continue
        if "--hostname" in args:
            named[args[args.index("--hostname") + 1].split("@")[0]] = child.pid
    return named


# --- figures read from the samples ----------------------------------------------------
def first(samples: list[Sample], test: Callable[[Sample], bool],
          after: float) -> float | None:
    """When (monotonic) the first sample at or after ``after`` passed ``test``."""
    return next((s.at for s in samples if s.at >= after and test(s)), None)


def last(samples: list[Sample], test: Callable[[Sample], bool], after: float) -> float | None:
    """When the last sample at or after ``after`` passed ``test`` (None: none did)."""
    return next((s.at for s in reversed(samples) if s.at >= after and test(s)), None)


def leaders_seen(samples: list[Sample], port: int, after: float,
                 names: dict[int, str]) -> list[tuple[float, str, int]]:
    """Each change of (leading beat, epoch) on the server on ``port`` after ``after``:
    (when, beat by name or '-', epoch)."""
    seen, previous = [], None
    for sample in samples:
        found = sample.leaders.get(port)
        if sample.at < after or found is None or found == previous:
            continue
        previous = found
        holder, epoch = found
        seen.append((sample.at, _beat_name(holder, names), epoch))
    return seen


def _beat_name(identity: str | None, names: dict[int, str]) -> str:
    """``host/pid/tag`` -> the beat's name by its pid ('-' for no leader)."""
    if not identity:
        return "-"
    parts = identity.split("/")
    return names.get(int(parts[1]), identity) if len(parts) > 1 and parts[1].isdigit() \
        else identity


# --- figures read from the logs ---------------------------------------------------------
LOG_TIME = re.compile(r"^\[(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3}): [^]]*\] ?")
SENTINEL_TIME = re.compile(r"^\d+:X (\d\d \w{3} \d{4} \d\d:\d\d:\d\d\.\d{3}) . (\S+)")
LEADS = re.compile(r"beat \S+/(\d+)/\S+ leads \(epoch (\d+)\)")
#: The last line of a traceback; a thread's death.
ERRORS = (re.compile(r"^(?:[a-z_.]+\.)?([A-Z]\w*(?:Error|Exception|Timeout)): ?(.*)$"),
          re.compile(r"^(Exception in thread) (\S+?):?$"))
#: A job's run that finished, under the job task's name or an earlier one.
SUCCEEDED = re.compile(r"Task (?:%s)\[([0-9a-f-]{36})\] succeeded.*"
                       r"'worker': '([^']*)'.*'started_at': ([0-9.]+)"
                       % "|".join(map(re.escape, sorted(JOB_TASK_NAMES))))


def records(log: Path) -> list[tuple[float | None, str]]:
    """(wall-clock time, text) per record of a Celery log, its prefix cut off. What a
    process printed to stderr comes a fragment a record (``ValueError``, ``:``, the
    message): such fragments are joined again."""
    found: list[tuple[float | None, str]] = []
    joining = False  # the last record waits for the fragment that ends it
    for line in log.read_text(errors="replace").splitlines() if log.exists() else []:
        match = LOG_TIME.match(line)
        at = _wall(match.group(1), "%Y-%m-%d %H:%M:%S,%f") if match else None
        text = line[match.end():] if match else line
        if not text.strip(" ^~"):
            continue
        if found and text.strip() == ":":  # after an exception's name, its message follows
            joining = bool(re.fullmatch(r"[\w.]+", found[-1][1].strip()))
            found[-1] = (found[-1][0], found[-1][1].rstrip() + ": ")
        elif found and joining:
            found[-1] = (found[-1][0], found[-1][1] + text.strip())
            joining = False
        else:
            found.append((at or (found[-1][0] if found else None), text))
            joining = text == "Exception in thread "
    return found


def _wall(text: str, form: str) -> float:
    return datetime.strptime(text, form).timestamp()


def leads_logged(log: Path, since_wall: float, until_wall: float,
                 names: dict[int, str]) -> list[tuple[float, str, int]]:
    """Each ``leads (epoch N)`` line of a beat log between the two times: (seconds after
    ``since_wall``, the beat by name, epoch)."""
    found = []
    for at, text in records(log):
        match = LEADS.search(text)
        if match and at is not None and since_wall <= at <= until_wall:
            found.append((round(at - since_wall, 1), names.get(int(match.group(1)), "?"),
                          int(match.group(2))))
    return found


LEASE = re.compile(r"beat \S+ (leads \(epoch \d+\)|stands by|cannot renew)")


def lease_at_end(log: Path, until_wall: float) -> dict[str, Any]:
    """What a beat last said of its lease before ``until_wall`` (``leads (epoch N)``,
    ``stands by``, ``cannot renew``; None: nothing), and whether its lease thread died
    (a beat whose thread died keeps the epoch it last led, and never says more)."""
    last, died = None, False
    for at, text in records(log):
        if at is not None and at > until_wall:
            break
        match = LEASE.search(text)
        last = match.group(1) if match else last
        died = died or text.startswith("Exception in thread gpulanes-beat-lease")
    return {"last": last, "lease_thread_died": died}


def errors_logged(logs: Iterable[Path], since_wall: float,
                  until_wall: float) -> Counter[str]:
    """The errors the logs name between the two times (tracebacks' last lines, dead
    threads), counted by ``log: Name: message`` with numbers masked."""
    found: Counter[str] = Counter()
    for log in logs:
        for at, text in records(log):
            match = next((m for p in ERRORS if (m := p.search(text.strip()))), None)
            if match and at is not None and since_wall <= at <= until_wall:
                message = re.sub(r"\d+", "N", match.group(2).strip())[:90]
                found[f"{log.stem}: {match.group(1)}: {message}"] += 1
    return found


def sentinel_events(logs: Iterable[Path], event: str, since_wall: float) -> float | None:
    """When (wall clock) a Sentinel first logged ``event`` (``+switch-master``,
    ``+convert-to-slave``...) after ``since_wall``; None if none did."""
    times = []
    for log in logs:
        for line in log.read_text(errors="replace").splitlines() if log.exists() else []:
            match = SENTINEL_TIME.match(line)
            if match and match.group(2) == event:
                times.append(_wall(match.group(1), "%d %b %Y %H:%M:%S.%f"))
    return min((t for t in times if t >= since_wall), default=None)


def finished_runs(log: Path) -> Counter[str]:
    """Runs that finished, per job id, as the workers' log says (Celery's ``succeeded``):
    a redelivered copy of a job that finished is answered with that run's result (the
    same worker and start), and is not a run of its own."""
    runs = {(m.group(1), m.group(2), m.group(3))
            for _, text in records(log) if (m := SUCCEEDED.search(text))}
    return Counter(job_id for job_id, _, _ in runs)
