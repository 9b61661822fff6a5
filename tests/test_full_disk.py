"""A nearly full artifact disk, for real: a 1 MB tmpfs under a real
worker, jobs writing 100 kB artifacts. A finished model's output waits for room
instead of its model running again, and the sick worker comes back only once the
disk has room, its self-checks backing off meanwhile. (The 100-job, minute-long
version: ``tests/soak/faults.py --only full-disk``.)"""
from __future__ import annotations

import re
import uuid
from pathlib import Path

import pytest
from conftest import wait_until

from gpu_worker.health import FIRST_PROBE_S
from tests.tmpfs import tmpfs

#: The disk, and what each job writes to it: ten artifacts fit, the eleventh does not.
DISK = "1m"
BLOB_BYTES = 100_000
JOBS = 14


@pytest.fixture(scope="module")
def small_disk():
    with tmpfs(DISK) as folder:
        yield folder


@pytest.fixture(scope="module")
def cluster(small_disk, cluster_factory):
    # torn down before small_disk: its worker leaves the disk before it is unmounted
    return cluster_factory(workers=1, env={"GPULANES_ARTIFACT_DIR": str(small_disk)})


class WorkerLog:
    """What the cluster's worker logged since this was made."""

    def __init__(self, cluster) -> None:
        self.path = Path(cluster.log_dir) / "workers.log"
        self.start = self.path.stat().st_size

    def text(self) -> str:
        with open(self.path, "rb") as log:
            log.seek(self.start)
            return log.read().decode(errors="replace")

    def count(self, words: str) -> int:
        return self.text().count(words)

    def check_delays_s(self) -> list[float]:
        return [float(d) for d in re.findall(r"next self-check in ([0-9.]+)s", self.text())]


@pytest.mark.cluster
@pytest.mark.timeout(180)
def test_a_full_disk_keeps_the_worker_aside_and_no_model_runs_twice(cluster, small_disk):
    from tasks import submit
    from tests.blob_model import runs_finished, runs_started

    log, batch = WorkerLog(cluster), uuid.uuid4().hex[:8]
    tags = [f"{batch}-{i}" for i in range(JOBS)]
    results = [submit(model="blob", tag=tag, size_bytes=BLOB_BYTES) for tag in tags]
    # ten artifacts fill the disk; the eleventh run keeps its output and waits, and the
    # worker steps aside: its self-checks fail, each twice as late as the last
    wait_until(lambda: log.count("self-check failed") >= 4, timeout_s=60,
               what="four failed self-checks while the disk is full")
    assert log.check_delays_s()[:4] == [FIRST_PROBE_S * 2**n for n in range(4)]
    assert log.count("serving again") == 0  # not back while the disk stays full
    assert sum(runs_started(tag) for tag in tags) == 11  # no other model ran meanwhile
    assert log.count("refused its output") == 1
    for artifact in small_disk.glob("*.bin"):  # room made, as an operator or the sweep would
        artifact.unlink()
    outs = [result.get(timeout=60) for result in results]
    assert [runs_finished(tag) for tag in tags] == [1] * JOBS  # no model ran twice
    assert {out["output"]["blob"]["bytes"] for out in outs} == {BLOB_BYTES}
    assert {out["attempts"] for out in outs} == {1}
    assert log.count("serving again") == 1  # back once, when there was room
