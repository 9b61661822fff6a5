"""A sick worker's self-check makes room for what its jobs write, and backs off while
it fails: the unit half; ``test_full_disk`` runs it on a real
worker."""
from __future__ import annotations

import errno
import itertools
import os
from types import SimpleNamespace

import pytest
from conftest import wait_until
from fsspec.implementations.memory import MemoryFileSystem

from gpu_worker import faults
from gpu_worker.faults import PROBE_MAX_BYTES, ArtifactBytes, check_store, self_check
from gpu_worker.health import PROBE_CAP_S, SelfHealth, probe_delays_s
from tasks.errors import ArtifactError
from tasks.settings import override
from tests.tmpfs import fill, tmpfs


def test_the_probe_needs_room_for_the_largest_recent_run_and_the_waiting_ones():
    written = ArtifactBytes(recent=3)
    assert written.need_bytes() == 0  # no job yet: a probe of a few bytes
    for n_bytes in (100, 5000, 10):
        written.ran(n_bytes)
    assert written.need_bytes() == 5000
    with written.waiting(3000):  # a finished run holds 3000 bytes the store refused
        assert written.need_bytes() == 8000
    written.ran(20)
    written.ran(30)  # 5000 is no longer among the last three
    assert written.need_bytes() == 30


def test_a_nearly_full_disk_fails_the_check_that_a_tiny_file_passes():
    with tmpfs("1m") as disk:
        fill(disk, leave_bytes=60_000)
        faults.check_folders([disk])  # what the check used to be: a tiny file fits
        written = ArtifactBytes()
        written.ran(100_000)  # ...but not what the last job wrote
        check = self_check(ArtifactError("cannot write"), written)
        with pytest.raises(OSError) as caught, override(artifact_dir=disk, artifact_url=None):
            check()
        assert caught.value.errno == errno.ENOSPC and "100000 needed" in str(caught.value)
        assert os.listdir(disk) == ["filler"]  # refused by free space: nothing written
        check_store(str(disk), 40_000)  # a smaller job's size fits: written and removed
        assert os.listdir(disk) == ["filler"]


class QuotaFS(MemoryFileSystem):
    """A memory store (one put is atomic there) that refuses any object over 1000 bytes:
    a quota."""

    protocol = ("quota", "memory")
    root_marker = "/"

    def pipe_file(self, path, value, *args, **kwargs):
        if len(value) > 1000:
            raise OSError(errno.EDQUOT, "Disk quota exceeded", path)
        return super().pipe_file(path, value, *args, **kwargs)


def test_a_store_is_checked_by_writing_a_probe_of_the_size():
    import fsspec

    fsspec.register_implementation("quota", QuotaFS, clobber=True)
    check_store("quota://probed", 999)
    assert QuotaFS().find("/probed") == []  # written and removed
    with pytest.raises(OSError):
        check_store("quota://probed", 2000)
    check_store("memory://probed", 10 * PROBE_MAX_BYTES)  # capped: a 16 MB probe at most
    assert fsspec.filesystem("memory").find("/probed") == []


def test_the_checks_back_off_doubling_up_to_a_minute():
    assert PROBE_CAP_S == 60
    assert list(itertools.islice(probe_delays_s(0.25), 12)) == [
        0.25, 0.5, 1, 2, 4, 8, 16, 32, 60, 60, 60, 60]
    assert list(itertools.islice(probe_delays_s(5.0), 6)) == [5, 10, 20, 40, 60, 60]
    assert list(itertools.islice(probe_delays_s(90.0), 2)) == [90, 90]


class Waits:
    """Stands in for the self-check thread's wake-up event: records each wait."""

    def __init__(self) -> None:
        self.waited_s: list[float] = []

    def wait(self, timeout_s: float) -> bool:
        self.waited_s.append(timeout_s)
        return False

    def clear(self) -> None:
        pass


def _sick(health: SelfHealth, failing_checks: int) -> None:
    """Make ``health`` sick with a check that fails ``failing_checks`` times, then passes;
    run its self-check loop to the end."""
    outcomes = iter([False] * failing_checks + [True])

    def check() -> None:
        if not next(outcomes):
            raise OSError(errno.ENOSPC, "No space left on device")

    health.store_refused(ArtifactError("cannot write"))
    health._check = check
    health._probe_until_well()


def test_a_disk_that_stays_full_is_checked_ever_less_often_and_only_a_success_resets():
    health = SelfHealth(sick_after=3, probe_s=0.25)
    health._wake = waits = Waits()
    _sick(health, failing_checks=9)
    assert waits.waited_s == [0.25, 0.5, 1, 2, 4, 8, 16, 32, 60, 60]
    assert health.stats()["sick"] is None  # the tenth check passed
    waits.waited_s.clear()
    _sick(health, failing_checks=1)  # sick again at once: it waits on where it stopped
    assert waits.waited_s == [60, 60]
    health.succeeded()  # a job ran and stored its output: the back-off starts over
    waits.waited_s.clear()
    _sick(health, failing_checks=1)
    assert waits.waited_s == [0.25, 0.5]


def test_a_refused_output_steps_aside_at_once_and_a_late_write_checks_at_once():
    health, sent = SelfHealth(sick_after=3, probe_s=3600), []
    health.lever = SimpleNamespace(step_aside=lambda: sent.append("aside"),
                                   resume=lambda: sent.append("resume"))
    health.store_refused(ArtifactError("cannot write /a/b: OSError: No space left"))
    assert health.stats() == {"sick": "the artifact store refused a finished job's output: "
                               "ArtifactError: cannot write /a/b: OSError: No space left",
                               "worker_faults": 0}
    assert sent == ["aside"]
    health._check = lambda: None  # the store has room again
    health.store_took()  # not an hour later: now
    wait_until(lambda: health.stats()["sick"] is None, timeout_s=10, what="an early check")
    assert sent == ["aside", "resume"]
