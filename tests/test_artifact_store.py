"""The artifact store: any fsspec URL, written atomically, named by job id only, read back
from a reference or a result, checked by size and sha256 (no workers needed)."""
from __future__ import annotations

import errno
import io
import hashlib
import subprocess
import sys
import uuid

import numpy as np
import pytest
from fsspec import register_implementation
from fsspec.implementations.local import LocalFileOpener
from fsspec.implementations.memory import MemoryFileSystem

import tasks.jobs.artifacts as artifacts
from tasks.errors import ArtifactError, ConfigError
from tasks.jobs.artifacts import ArtifactRef, is_intact, open_artifact, store_bytes
from tasks.jobs.cache import intact
from tasks.settings import PROJECT_DIR, load, override
from tasks.worker.png import png_bytes, store_png

DATA = b"\x00gpulanes artifact\xff" * 1000
PIXELS = np.arange(8 * 8 * 3, dtype=np.uint8).reshape(8, 8, 3)


class FlakyFS(MemoryFileSystem):
    """A store whose writes put half the bytes down, then fail (a disk filling up)."""

    protocol = "gltestflaky"
    store: dict = {}
    pseudo_dirs = [""]

    def _open(self, path, mode="rb", **kwargs):
        file = super()._open(path, mode, **kwargs)
        if "w" in mode:
            def write(data):
                file.seek(0)
                file.truncate()
                type(file).write(file, data[: len(data) // 2])
                raise OSError(errno.ENOSPC, "No space left on device")
            file.write = write
        return file


class ReadOnlyFS(MemoryFileSystem):
    """A store that refuses every write."""

    protocol = "gltestreadonly"
    store: dict = {}
    pseudo_dirs = [""]

    def _open(self, path, mode="rb", **kwargs):
        if "r" not in mode:
            raise PermissionError(errno.EACCES, "read-only store", path)
        return super()._open(path, mode, **kwargs)

    def makedirs(self, path, exist_ok=False):
        raise PermissionError(errno.EACCES, "read-only store", path)


register_implementation(FlakyFS.protocol, FlakyFS, clobber=True)
register_implementation(ReadOnlyFS.protocol, ReadOnlyFS, clobber=True)


@pytest.fixture
def memory_root():
    """A fresh folder of the process' memory:// store, emptied afterwards."""
    folder = f"/gltest-{uuid.uuid4().hex[:12]}"
    yield f"memory:/{folder}"
    for key in [k for k in MemoryFileSystem.store if k.startswith(folder + "/")]:
        del MemoryFileSystem.store[key]


def _check_round_trip(ref: ArtifactRef, data: bytes) -> None:
    assert ref.bytes == len(data) and ref.sha256 == hashlib.sha256(data).hexdigest()
    with open_artifact(ref.as_dict()) as file:
        assert file.read() == data
    assert is_intact(ref.as_dict())


def test_a_memory_store_round_trip_by_reference_and_by_result(memory_root):
    job_id = str(uuid.uuid4())
    with override(artifact_url=memory_root):
        image = store_png(job_id, PIXELS, 3)
        blob = store_bytes(job_id, 3, "output", DATA, "application/octet-stream")
    assert image.url == f"{memory_root}/{job_id}-3.png"  # the first image: today's name
    assert blob.url == f"{memory_root}/{job_id}-3-output.bin"
    assert blob.as_dict() == {"url": blob.url, "media_type": "application/octet-stream",
                              "bytes": len(DATA), "sha256": hashlib.sha256(DATA).hexdigest()}
    _check_round_trip(image, png_bytes(PIXELS))
    _check_round_trip(blob, DATA)
    result = {"image": image.url, "bytes": image.bytes, "sha256": image.sha256,
              "output": {"blob": blob.as_dict(), "frames": [image.as_dict()]}}
    with open_artifact(result) as file:
        assert file.read() == png_bytes(PIXELS)
    assert intact(result)


def test_a_changed_or_vanished_artifact_in_a_store_is_no_hit(memory_root):
    job_id = str(uuid.uuid4())
    with override(artifact_url=memory_root):
        image = store_png(job_id, PIXELS, 1)
        blob = store_bytes(job_id, 1, "output", DATA, "application/octet-stream")
    result = {"image": image.url, "bytes": image.bytes, "sha256": image.sha256,
              "output": {"blob": blob.as_dict()}}
    MemoryFileSystem().pipe_file(blob.url, DATA[::-1])  # same size, other bytes
    assert is_intact(image.as_dict()) and not intact(result)
    MemoryFileSystem().rm(blob.url)
    assert not intact(result)
    assert intact({"image": image.url})  # a result from before sizes and hashes: it exists


def test_a_file_url_store_writes_where_it_says(tmp_path):
    job_id = str(uuid.uuid4())
    ref = store_png(job_id, PIXELS, 2, root=(tmp_path / "store").as_uri())
    assert ref.url == (tmp_path / "store" / f"{job_id}-2.png").as_uri()
    assert (tmp_path / "store" / f"{job_id}-2.png").read_bytes() == png_bytes(PIXELS)
    _check_round_trip(ref, png_bytes(PIXELS))
    assert intact({"image": ref.url, "bytes": ref.bytes, "sha256": ref.sha256})
    assert [p.name for p in tmp_path.rglob("*") if p.is_file()] == [f"{job_id}-2.png"]


def test_the_local_default_keeps_plain_paths(tmp_path):
    job_id = str(uuid.uuid4())
    with override(artifact_dir=tmp_path) as settings:
        assert settings.artifact_url is None and settings.artifact_root == str(tmp_path)
        ref = store_png(job_id, PIXELS, 1)
    assert ref.url == str(tmp_path / f"{job_id}-1.png")  # what results' `image` always was
    saved = store_png(job_id, PIXELS, 1, root=str(tmp_path))  # the folder named outright
    assert saved == ref
    _check_round_trip(ref, png_bytes(PIXELS))


@pytest.mark.parametrize("job_id", ["../../etc/passwd", "a/b", "..", "",
                                    "12345678-1234-1234-1234-1234567890ab/../../x"])
def test_a_job_id_that_is_no_uuid_never_names_an_artifact(memory_root, tmp_path, job_id):
    with pytest.raises(ValueError):
        store_bytes(job_id, 1, "output", DATA, "application/octet-stream", root=memory_root)
    with pytest.raises(ValueError):
        store_png(job_id, PIXELS, 1, root=tmp_path.as_uri())
    assert not MemoryFileSystem().find(memory_root) and not list(tmp_path.rglob("*"))


@pytest.mark.parametrize("name", ["../x", "a/b", ".hidden", "out.bin", "", "Image", "x" * 65])
def test_an_artifact_name_holds_no_path(memory_root, name):
    with pytest.raises(ValueError):
        store_bytes(str(uuid.uuid4()), 1, name, DATA, "text/plain", root=memory_root)
    assert not MemoryFileSystem().find(memory_root)


def test_a_write_failing_midway_leaves_nothing_under_the_final_name():
    job_id, root = str(uuid.uuid4()), f"{FlakyFS.protocol}://store"
    with pytest.raises(ArtifactError, match="No space left") as caught:
        store_bytes(job_id, 1, "output", DATA, "application/octet-stream", root=root)
    assert isinstance(caught.value.__cause__, OSError)
    assert not FlakyFS.store  # neither the artifact nor its half-written temporary


class _HalfThenFull(io.FileIO):
    """A local file that takes half of a write, then finds the disk full."""

    def write(self, data):
        super().write(bytes(data)[: len(data) // 2])
        raise OSError(errno.ENOSPC, "No space left on device")


def test_a_local_write_failing_midway_leaves_nothing(tmp_path, monkeypatch):
    def half_then_full(self, data):
        self.f.write(data[: len(data) // 2])
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(LocalFileOpener, "write", half_then_full)  # file:// (fsspec)
    monkeypatch.setattr(artifacts, "open", _HalfThenFull, raising=False)  # a plain folder
    for root in (str(tmp_path), tmp_path.as_uri()):
        with pytest.raises(ArtifactError, match="No space left"):
            store_png(str(uuid.uuid4()), PIXELS, 1, root=root)
    assert not [p for p in tmp_path.rglob("*") if p.is_file()]


def test_a_single_put_store_that_fails_shows_nothing(memory_root, monkeypatch):
    def refuse(self, path, value, **kwargs):
        raise ConnectionResetError("the store hung up")

    monkeypatch.setattr(MemoryFileSystem, "pipe_file", refuse)
    with pytest.raises(ArtifactError, match="hung up"):
        store_bytes(str(uuid.uuid4()), 1, "image", DATA, "image/png", root=memory_root)
    assert not MemoryFileSystem().find(memory_root)


def test_a_store_that_refuses_raises_artifact_error(tmp_path):
    with pytest.raises(ArtifactError, match="read-only"):
        store_png(str(uuid.uuid4()), PIXELS, 1, root=f"{ReadOnlyFS.protocol}://store")
    (tmp_path / "taken").write_bytes(b"a file where the store's folder should be")
    for root in (str(tmp_path / "taken"), (tmp_path / "taken").as_uri()):
        with pytest.raises(ArtifactError):
            store_png(str(uuid.uuid4()), PIXELS, 1, root=root)


def test_a_missing_artifact_in_a_store_is_not_intact():
    ref = {"url": f"{ReadOnlyFS.protocol}://store/nothing.png", "bytes": 3, "sha256": "0"}
    assert not is_intact(ref) and not is_intact({"url": ref["url"]})


def test_the_store_url_is_checked_once():
    with pytest.raises(ConfigError, match="GPULANES_ARTIFACT_URL"):
        load(artifact_url="/srv/artifacts")
    assert load(artifact_url="memory://").artifact_root == "memory://"


def test_importing_the_artifacts_module_loads_no_fsspec():
    """A submitting process with the local default never pays for fsspec's import."""
    probe = "import sys, tasks.jobs.artifacts; print('fsspec' in sys.modules)"
    proc = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                          cwd=PROJECT_DIR, check=True)
    assert proc.stdout.strip() == "False"
