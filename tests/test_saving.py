"""A finished run's output survives a store that refuses it for a while: the run keeps the bytes and writes them once the store takes them, the
worker stepping aside meanwhile; a run taken over writes nothing; only a store that
refuses for the whole wait fails the run."""
from __future__ import annotations

import time
import uuid
from types import SimpleNamespace

import numpy as np
import pytest

from gpu_worker.faults import ArtifactBytes
from gpu_worker.health import SelfHealth
from tasks.errors import ArtifactError, LeaseLost, OutputError
from tasks.jobs import artifacts
from tasks.settings import override, settings
from tasks.worker import saving
from tasks.worker.outputs import Blob, encoded_output, with_references


class Lease:
    """A run's lease (``gpu_worker.lease.Lease``): held until ``lost_after`` checks."""

    def __init__(self, lost_after: int = 1000) -> None:
        self.attempt, self.checks, self.lost_after = 2, 0, lost_after

    def check(self) -> None:
        self.checks += 1
        if self.checks > self.lost_after:
            raise LeaseLost("taken over")


@pytest.fixture
def store(monkeypatch, tmp_path):
    """A local store that refuses its first ``refusals`` writes; a fresh health record."""
    state = SimpleNamespace(refusals=0, tries=0, health=SelfHealth(sick_after=3, probe_s=3600),
                            written=ArtifactBytes())
    real = artifacts.store_bytes

    def store_bytes(*args, **kwargs):
        state.tries += 1
        if state.tries <= state.refusals:
            raise ArtifactError("cannot write: OSError: [Errno 28] No space left on device")
        return real(*args, **kwargs)

    monkeypatch.setattr(saving, "store_bytes", store_bytes)
    monkeypatch.setattr(saving, "HEALTH", state.health)
    monkeypatch.setattr(saving, "ARTIFACT_BYTES", state.written)
    monkeypatch.setattr(saving, "FIRST_PROBE_S", 0.01)
    with override(artifact_dir=tmp_path, artifact_url=None):
        yield state


def _blobs() -> list[Blob]:
    return [Blob("image", b"\x89PNG" * 100, "image/png"), Blob("output-0", b"x" * 50,
                                                               "application/octet-stream")]


def test_a_refused_output_waits_for_the_store_and_the_worker_steps_aside(store, tmp_path):
    store.refusals = 3
    job_id, lease = str(uuid.uuid4()), Lease()
    refs = saving.write_all(job_id, lease, _blobs(), time.time())
    assert sorted(p.name for p in tmp_path.iterdir()) == [f"{job_id}-2-output-0.bin",
                                                          f"{job_id}-2.png"]
    assert refs["image"].bytes == 400 and refs["output-0"].bytes == 50
    assert store.tries == 5 and lease.checks == 5  # checked before every try
    assert store.health.stats()["sick"].startswith("the artifact store refused")
    # the next self-check makes room for this much (none is held in memory any more)
    assert store.written.need_bytes() == 450


def test_a_run_taken_over_while_it_waits_writes_nothing(store, tmp_path):
    store.refusals = 1000
    with pytest.raises(LeaseLost):
        saving.write_all(str(uuid.uuid4()), Lease(lost_after=3), _blobs(), time.time())
    assert list(tmp_path.iterdir()) == []


def test_a_store_that_refuses_for_the_whole_wait_fails_the_run(store, tmp_path):
    store.refusals = 1000
    # the run began so long ago that a run may hold its job only 0.2s more
    began = time.time() - settings.run_hung_s + 2 * settings.lease_ttl_s + 0.2
    with pytest.raises(ArtifactError, match="No space left"):
        saving.write_all(str(uuid.uuid4()), Lease(), _blobs(), began)
    assert 3 <= store.tries <= 6 and list(tmp_path.iterdir()) == []


def test_an_output_json_cannot_hold_fails_before_anything_is_encoded_to_disk():
    pixels = np.zeros((4, 4, 3), dtype=np.uint8)
    with pytest.raises(OutputError, match="JSON cannot hold"):
        encoded_output({"image": pixels, "bad": object()})
    encoded, blobs = encoded_output({"images": [pixels, pixels], "blob": b"1", "n": 3})
    assert [(b.name, b.media_type) for b in blobs] == [
        ("image", "image/png"), ("image-1", "image/png"), ("output-0", "application/octet-stream")]
    refs = {b.name: artifacts.ArtifactRef(f"/s/{b.name}", b.media_type, len(b.data), "0" * 64)
            for b in blobs}
    output = with_references(encoded, refs)
    assert [ref["url"] for ref in output["images"]] == ["/s/image", "/s/image-1"]
    assert output["blob"]["bytes"] == 1 and output["n"] == 3
