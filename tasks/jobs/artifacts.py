"""Artifacts: one PNG per job, named by job id (never by anything a caller typed)."""
from __future__ import annotations

import hashlib
import uuid
from dataclasses import dataclass
from pathlib import Path


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
