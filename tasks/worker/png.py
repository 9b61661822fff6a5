"""Writing a job's image: a PNG, atomically, named by job and run."""
from __future__ import annotations

import contextlib
import hashlib
import io
import os
import uuid
from pathlib import Path

import numpy as np
from PIL import Image

from tasks.errors import ArtifactError
from tasks.jobs.artifacts import Artifact, artifact_path


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
