"""Artifacts: one PNG per job, named by job id (never by anything a caller typed)."""
from __future__ import annotations

import os
import uuid
from pathlib import Path

import numpy as np
from PIL import Image


def artifact_path(artifact_dir: Path, job_id: str) -> Path:
    """Where the PNG of ``job_id`` lives; the id must be a UUID."""
    return Path(artifact_dir) / f"{uuid.UUID(job_id)}.png"


def save_png(artifact_dir: Path, job_id: str, pixels: np.ndarray) -> Path:
    """Write ``pixels`` (H x W x 3, uint8) atomically: readers never see half a file."""
    path = artifact_path(artifact_dir, job_id)
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_name(f".{path.name}.{uuid.uuid4().hex}.partial")
    Image.fromarray(pixels, mode="RGB").save(partial, format="PNG")
    os.replace(partial, path)
    return path
