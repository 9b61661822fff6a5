"""Artifacts expire with their results: workers sweep what is
older than ``artifact_ttl_s`` from a local folder or any fsspec store, a bounded
batch per round, never anything younger and never a file that is no artifact."""
from __future__ import annotations

import os
import time
import uuid

import fsspec

from tasks.jobs.artifacts import PROBE_PREFIX, artifact_name, store_bytes
from tasks.jobs.expiry import SWEEP_EVERY_S, Sweeper
from tasks.settings import override, settings

TTL_S = 3600


def _sweep_all(sweeper: Sweeper, now_s: float) -> list[int]:
    """Rounds until a pass is over: how many each round deleted."""
    deleted = []
    for _ in range(100):
        count, over = sweeper.round(now_s)
        deleted.append(count)
        if over:
            return deleted
    raise AssertionError("the pass never ended")


def _aged(path, age_s: float) -> None:
    when = time.time() - age_s
    os.utime(path, (when, when))


def test_a_local_folder_loses_only_artifacts_older_than_the_ttl(tmp_path):
    old = [tmp_path / artifact_name(str(uuid.uuid4()), 1, "output", "text/plain")
           for _ in range(7)]
    young = tmp_path / artifact_name(str(uuid.uuid4()), 1)
    partial = tmp_path / f".{young.name}.{uuid.uuid4().hex}.partial"  # a killed write's
    probe = tmp_path / f"{PROBE_PREFIX}{uuid.uuid4().hex}"
    keep = [tmp_path / "README.txt", tmp_path / "sub"]  # not artifacts: never touched
    for path in [*old, young, partial, probe, keep[0]]:
        path.write_bytes(b"x")
        _aged(path, TTL_S + 10)
    keep[1].mkdir()
    _aged(young, TTL_S - 60)  # a minute short of the TTL: kept
    deleted = _sweep_all(Sweeper(str(tmp_path), ttl_s=TTL_S, batch=4), time.time())
    assert max(deleted) <= 4 and sum(deleted) == 9 and len(deleted) == 4  # 12 entries, 4 a round
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([young.name, "README.txt", "sub"])


def test_a_memory_store_loses_only_artifacts_older_than_the_ttl():
    root = f"memory://sweep-{uuid.uuid4().hex[:8]}"
    refs = [store_bytes(str(uuid.uuid4()), 1, "output", b"data", "text/plain", root=root)
            for _ in range(5)]
    written_at = time.time()
    fs = fsspec.filesystem("memory")
    fs.pipe_file(f"{root[len('memory://'):]}/notes.txt", b"an operator's file")
    sweeper = Sweeper(root, ttl_s=TTL_S, batch=2)
    assert sum(_sweep_all(sweeper, written_at + TTL_S - 5)) == 0  # younger than the TTL
    assert len(fs.ls(root)) == 6
    deleted = _sweep_all(sweeper, written_at + TTL_S + 5)
    assert sum(deleted) == 5 and max(deleted) <= 2
    assert [info.rpartition("/")[2] for info in fs.ls(root, detail=False)] == ["notes.txt"]
    assert all(not fs.exists(ref.url) for ref in refs)


def test_a_missing_store_is_nothing_to_sweep(tmp_path):
    assert Sweeper(str(tmp_path / "none yet"), ttl_s=1).round() == (0, True)
    assert Sweeper(f"memory://none-{uuid.uuid4().hex[:8]}", ttl_s=1).round() == (0, True)


def test_the_ttl_outlives_every_result_naming_it_and_sets_the_rest_between_passes():
    # a cache hit at the end of its entry's life gives a result that lives on as long
    assert settings.artifact_ttl_s == settings.result_ttl_s + settings.cache_ttl_s
    with override(result_ttl_s=120, cache=False):
        assert settings.artifact_ttl_s == 120
        assert Sweeper().rest_s() == 120 / 4  # a quarter of a short TTL
    with override(result_ttl_s=7 * 24 * 3600, cache=False):
        assert settings.artifact_ttl_s == 7 * 24 * 3600
        assert Sweeper().rest_s() == SWEEP_EVERY_S


def test_the_sweep_follows_the_store_setting(tmp_path):
    artifact = tmp_path / artifact_name(str(uuid.uuid4()), 1)
    artifact.write_bytes(b"x")
    _aged(artifact, 20)
    with override(artifact_dir=tmp_path, artifact_url=None, result_ttl_s=10, cache=False):
        assert Sweeper().round() == (1, True)
    assert not artifact.exists()
