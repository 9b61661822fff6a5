"""Writing a job's image: a PNG, atomically, named by job and run."""
from __future__ import annotations

import io
from typing import Any

import numpy as np
from PIL import Image

from tasks.jobs.artifacts import IMAGE, ArtifactRef, artifact_name, store_bytes

PNG = "image/png"


def png_bytes(image: Any) -> bytes:
    """A PIL image, or uint8 pixels (H x W, or x 3 or 4), encoded as a PNG."""
    encoded = io.BytesIO()
    (image if hasattr(image, "save") else Image.fromarray(image)).save(encoded, format="PNG")
    return encoded.getvalue()


def store_png(job_id: str, pixels: np.ndarray, run: int | None = None, *,
              name: str = IMAGE, root: str | None = None) -> ArtifactRef:
    """Store ``pixels`` as artifact ``name`` (``image``, ``image-1``...) of ``job_id``'s
    run ``run`` in the artifact store (``root``, default ``settings.artifact_root``);
    the reference's ``url`` is what a result's ``image`` holds. A store that refuses
    raises :class:`~tasks.errors.ArtifactError`: the worker's trouble, not the job's."""
    artifact_name(job_id, run, name, PNG)  # a bad id or name fails before any encoding
    return store_bytes(job_id, run, name, png_bytes(pixels), PNG, root=root)
