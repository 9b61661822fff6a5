"""Artifacts: a job's output files in the artifact store, named by job id (never by
anything a caller typed), written atomically, checked by size and sha256.

The store is ``settings.artifact_root``: ``GPULANES_ARTIFACT_URL`` (any fsspec URL:
``s3://bucket/artifacts``, ``gs://...``, ``file:///srv/artifacts``, ``memory://x``),
else the local folder ``GPULANES_ARTIFACT_DIR``, whose artifacts results name by their
plain path as they always did. A reference's ``url`` is what :func:`open_artifact`
reads back, from any host that can reach the store.

fsspec is imported on first use, not with this module: a process that only submits
imports this module (the result cache) and, with the local default, never needs it.
"""
from __future__ import annotations

import contextlib
import errno
import hashlib
import os
import re
import shutil
import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

from tasks.errors import ArtifactError
from tasks.settings import settings

#: The name of a job's first image: its file keeps the historical ``<job id>-<run>.png``.
IMAGE = "image"
#: Names a job's artifacts may have ("image", "image-1", "output", "mask_2"): the
#: worker chooses them, never a caller, and they can hold no separator or dot.
NAME = re.compile(r"[a-z0-9][a-z0-9_-]{0,63}")
#: File extensions by media type; any other type is stored as ``.bin``.
EXTENSIONS = {"image/png": "png", "image/jpeg": "jpg", "image/webp": "webp",
              "audio/wav": "wav", "audio/mpeg": "mp3", "video/mp4": "mp4",
              "application/json": "json", "text/plain": "txt",
              "application/octet-stream": "bin"}
#: Stores where one put is atomic (readers see all of an object or nothing): no
#: temporary name, whose copy-and-delete "rename" would only double the upload.
SINGLE_PUT = frozenset({"memory", "s3", "s3a", "gs", "gcs", "az", "abfs", "abfss", "adl",
                        "oci", "oss"})
_BLOCK = 1 << 20


@dataclass(frozen=True)
class ArtifactRef:
    """An artifact in the store, as results carry it: its URL (a plain path for the
    local default), media type, size and sha256."""

    url: str
    media_type: str
    bytes: int
    sha256: str

    def as_dict(self) -> dict[str, Any]:
        """The reference as a result holds it (JSON-safe)."""
        return {"url": self.url, "media_type": self.media_type, "bytes": self.bytes,
                "sha256": self.sha256}


def artifact_name(job_id: str, run: int | None = None, name: str = IMAGE,
                  media_type: str = "image/png") -> str:
    """The file name of artifact ``name`` of ``job_id``'s run ``run``: the id must be a
    UUID and ``name`` match :data:`NAME` (else ``ValueError``). Each run writes its own
    files: a stale run can never overwrite the winner's."""
    if not isinstance(name, str) or not NAME.fullmatch(name):
        raise ValueError(f"artifact name {name!r} must match {NAME.pattern}")
    suffix = f"-{int(run)}" if run is not None else ""
    named = "" if name == IMAGE else f"-{name}"
    return f"{uuid.UUID(job_id)}{suffix}{named}.{EXTENSIONS.get(media_type, 'bin')}"


def artifact_url(root: str, file_name: str) -> str:
    """``file_name`` under the store ``root``: a plain path for a local folder, else a URL."""
    if "://" not in root:
        return str(Path(root) / file_name)
    return f"{root}{file_name}" if root.endswith("/") else f"{root}/{file_name}"


def file_sha256(path: Path) -> str:
    """The sha256 of a file's bytes, read in blocks."""
    with open(path, "rb") as file:
        return _sha256(file)


def _sha256(file: IO[bytes]) -> str:
    digest = hashlib.sha256()
    for block in iter(lambda: file.read(_BLOCK), b""):
        digest.update(block)
    return digest.hexdigest()


def filesystem(url: str) -> tuple[Any, str]:
    """The fsspec file system of ``url`` and the path in it."""
    import fsspec  # on first use only: see the module's docstring

    return fsspec.core.url_to_fs(url)


def store_bytes(job_id: str, run: int | None, name: str, data: bytes, media_type: str,
                *, root: str | None = None) -> ArtifactRef:
    """Write ``data`` as artifact ``name`` of ``job_id``'s run ``run`` into the store
    (``root``, default ``settings.artifact_root``), atomically: readers see the whole
    artifact under its name or nothing. A store that refuses (full, read-only, gone,
    no credentials) raises :class:`ArtifactError`: the worker's trouble, not the job's.
    An id that is no UUID or a bad ``name`` raises ``ValueError`` before any write."""
    url = artifact_url(root or settings.artifact_root, artifact_name(job_id, run, name,
                                                                   media_type))
    data = data if isinstance(data, bytes) else bytes(data)
    try:
        if "://" in url:
            _put(*filesystem(url), data)
        else:  # the local folder: the standard library, as fsspec's file system would
            _put_local(url, data)
    except Exception as exc:  # noqa: BLE001  each store raises its own kinds of refusal
        raise ArtifactError(f"cannot write {url}: {type(exc).__name__}: {exc}") from exc
    return ArtifactRef(url, media_type, len(data), hashlib.sha256(data).hexdigest())


#: A probe's file name starts so: never an artifact's, and swept if a probe is cut short.
PROBE_PREFIX = ".gpulanes-probe-"


def local_folder(root: str) -> Path | None:
    """The local folder of store ``root`` (a plain path or a ``file://`` URL); None for
    any other store."""
    if "://" not in root:
        return Path(root)
    if root.startswith("file://"):
        return Path(filesystem(root)[1])
    return None


def probe_store(root: str, n_bytes: int) -> None:
    """Write ``n_bytes`` (at least a few) under a probe name into store ``root`` as an
    artifact is written, then remove them; raise as the store refuses. A local folder
    (made if missing, as a job would) must first show that much free space: a full
    disk is refused without a write."""
    folder, name = local_folder(root), f"{PROBE_PREFIX}{uuid.uuid4().hex}"
    data = os.urandom(max(n_bytes, 8))  # random: a compressing file system stores it all
    if folder is None:
        fs, path = filesystem(artifact_url(root, name))
        _put(fs, path, data)
        fs.rm(path)
        return
    folder.mkdir(parents=True, exist_ok=True)
    if (free_bytes := shutil.disk_usage(folder).free) < n_bytes:
        raise OSError(errno.ENOSPC, f"No space left: {free_bytes} bytes free, {n_bytes} "
                      "needed", str(folder))
    _put_local(str(folder / name), data)
    os.unlink(folder / name)


def _put(fs: Any, path: str, data: bytes) -> None:
    """One put where a put is atomic; elsewhere a temporary name in the same folder,
    then a rename (atomic on a POSIX file system), the temporary removed on failure."""
    if _protocols(fs) & SINGLE_PUT:
        fs.pipe_file(path, data)
        return
    parent, partial = _partial(path)
    fs.makedirs(parent, exist_ok=True)
    try:
        with fs.open(partial, "wb") as file:
            file.write(data)
        _rename(fs, partial, path)
    except BaseException:
        with contextlib.suppress(Exception):
            fs.rm(partial)
        raise


def _partial(path: str) -> tuple[str, str]:
    """(the folder of ``path``, a temporary name there to write it under first)."""
    parent, _, file_name = path.rpartition("/")
    return parent, f"{parent}/.{file_name}.{uuid.uuid4().hex}.partial"


def _put_local(path: str, data: bytes) -> None:
    """:func:`_put` into a local folder with the standard library: a temporary name in
    the same folder, then ``os.replace`` (fsspec's local file system does the same,
    with about a millisecond more of Python per artifact)."""
    parent, partial = _partial(path)
    os.makedirs(parent or ".", exist_ok=True)
    try:
        with open(partial, "xb") as file:
            file.write(data)
        os.replace(partial, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(partial)
        raise


def _protocols(fs: Any) -> set[str]:
    return {fs.protocol} if isinstance(fs.protocol, str) else set(fs.protocol)


def _rename(fs: Any, source: str, target: str) -> None:
    if "file" in _protocols(fs):  # os.replace: atomic, and never moves *into* a folder
        os.replace(source, target)
    else:
        fs.mv(source, target)


def _url_of(ref_or_result: Mapping[str, Any] | str) -> str:
    if isinstance(ref_or_result, str):
        return ref_or_result
    url = ref_or_result.get("url") or ref_or_result.get("image")
    if not isinstance(url, str) or not url:
        raise ValueError("no artifact here: pass a reference ({'url': ...}), a result with "
                         "an 'image', or one of result['output']'s references")
    return url


def open_artifact(ref_or_result: Mapping[str, Any] | str) -> IO[bytes]:
    """Open an artifact for reading, from any host that can reach the store: a
    reference (``{"url": ...}``, as in a result's ``output``), a result (its
    ``image``) or a URL. ``with open_artifact(result) as file: png = file.read()``."""
    fs, path = filesystem(_url_of(ref_or_result))
    return fs.open(path, "rb")


def references(result: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The artifacts a result names: its ``image`` (with the result's ``bytes`` and
    ``sha256`` when it has them) and every reference among its ``output``'s values
    (or in a list there), each URL once."""
    found: dict[str, dict[str, Any]] = {}
    if result.get("image"):
        found[result["image"]] = {"url": result["image"], **{
            k: result[k] for k in ("bytes", "sha256") if result.get(k) is not None}}
    for value in (result.get("output") or {}).values():
        for item in value if isinstance(value, list) else [value]:
            if isinstance(item, Mapping) and isinstance(item.get("url"), str):
                found.setdefault(item["url"], dict(item))
    return list(found.values())


def is_intact(ref: Mapping[str, Any]) -> bool:
    """Whether the artifact ``ref`` names is still the one written: same size and
    sha256 (a reference without them: the artifact exists). A local path is checked
    with the standard library; a URL through its store, read in blocks."""
    url = ref["url"]
    if "://" not in url:
        path = Path(url)
        if "sha256" not in ref:
            return path.is_file()
        try:
            return _same_size(path.stat().st_size, ref) and file_sha256(path) == ref["sha256"]
        except OSError:
            return False
    return _remote_intact(url, ref)


def _same_size(size: int, ref: Mapping[str, Any]) -> bool:
    return ref.get("bytes") is None or size == ref["bytes"]


def _remote_intact(url: str, ref: Mapping[str, Any]) -> bool:
    try:
        fs, path = filesystem(url)
        if "sha256" not in ref:
            return bool(fs.isfile(path))
        if not _same_size(fs.size(path), ref):  # metadata first: spares reading a changed one
            return False
        with fs.open(path, "rb") as file:
            return _sha256(file) == ref["sha256"]
    except Exception:  # noqa: BLE001  unreachable or gone: the job simply runs again
        return False


#: A file an artifact may be stored as (see :func:`artifact_name`).
ARTIFACT_FILE = re.compile(r"[0-9a-f-]{36}(-\d+)?(-[a-z0-9][a-z0-9_-]{0,63})?\.[a-z0-9]{1,5}")


def in_store(url: str) -> str:
    """``url`` if it names an artifact in the store, else ``ValueError``: an input may
    name a file for a model to read only there (never ``/etc/passwd``, never ``..``)."""
    root = settings.artifact_root.rstrip("/")
    if not isinstance(url, str) or "\x00" in url:
        raise ValueError("must be the URL of an artifact in the artifact store")
    name = url[len(root) + 1:] if url.startswith(root + "/") else ""
    if not name or "/" in name or name in (".", "..") or not ARTIFACT_FILE.fullmatch(name):
        raise ValueError(f"must name an artifact in the artifact store ({root}/<job id>-...), "
                         f"got {url[:200]!r}")
    return url
