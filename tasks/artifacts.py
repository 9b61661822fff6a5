"""Artifacts: one PNG per job, named by job id (never by anything a caller typed)."""
from __future__ import annotations

import contextlib
import hashlib
import io
import os
import uuid
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from PIL import Image

from tasks.errors import ArtifactError


@dataclass(frozen=True)
class Artifact:
    """A written artifact: where, how many bytes, and their sha256 (for checks later)."""

    path: Path
    bytes: int
    sha256: str


def artifact_path(artifact_dir: Path, job_id: str, run: int | None = None) -> Path:
    """Where the PNG of ``job_id`` (of its run number ``run``) lives; the id must be a
    UUID. Each run writes its own file: a stale run can never overwrite the winner's."""
    suffix = f"-{int(run)}" if run is not None else ""
    return Path(artifact_dir) / f"{uuid.UUID(job_id)}{suffix}.png"


def file_sha256(path: Path) -> str:
    """The sha256 of a file's bytes, read in blocks."""
    digest = hashlib.sha256()
    with open(path, "rb") as file:
        for block in iter(lambda: file.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def save_png(artifact_dir: Path, job_id: str, pixels: np.ndarray,
             run: int | None = None) -> Artifact:
    """Write ``pixels`` (H x W x 3, uint8) atomically: readers never see half a file.

    A file system that refuses (full, read-only, gone) raises :class:`ArtifactError`:
    the worker's trouble, not the job's.
    """
    path = artifact_path(artifact_dir, job_id, run)
    encoded = io.BytesIO()
    Image.fromarray(pixels, mode="RGB").save(encoded, format="PNG")
    data = encoded.getvalue()
    partial = path.with_name(f".{path.name}.{uuid.uuid4().hex}.partial")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        partial.write_bytes(data)
        os.replace(partial, path)
    except OSError as exc:
        with contextlib.suppress(OSError):
            partial.unlink(missing_ok=True)
        raise ArtifactError(f"cannot write {path}: {type(exc).__name__}: {exc}") from exc
    return Artifact(path, len(data), hashlib.sha256(data).hexdigest())
