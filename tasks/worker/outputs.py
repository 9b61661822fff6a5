"""A model's returned dict made into a result's ``output``: images (PIL images, uint8
arrays) stored as PNG artifacts and bytes as binary ones, each replaced by its
reference ``{"url", "media_type", "bytes", "sha256"}`` (``tasks.jobs.artifacts``);
everything else must be JSON. Anything else fails the job with that reason
(:class:`OutputError`), and the worker goes on serving."""
from __future__ import annotations

import itertools
import json
from typing import Any, Iterator

from tasks.errors import OutputError
from tasks.jobs.artifacts import IMAGE, store_bytes
from tasks.worker.png import PNG, png_bytes

BINARY = "application/octet-stream"


def stored_output(job_id: str, run: int, output: Any) -> dict[str, Any]:
    """``output`` with its images and bytes stored, checked to be JSON."""
    if not isinstance(output, dict):
        raise OutputError(f"predict returned a {type(output).__name__}, not a dict")
    names = (IMAGE if i == 0 else f"{IMAGE}-{i}" for i in itertools.count())
    blobs = (f"output-{i}" for i in itertools.count())
    stored = _stored(output, job_id, run, names, blobs)
    try:
        json.dumps(stored, allow_nan=False)
    except (TypeError, ValueError) as exc:
        raise OutputError(f"predict returned what JSON cannot hold: {exc}") from exc
    return stored


def _stored(value: Any, job_id: str, run: int, names: Iterator[str],
            blobs: Iterator[str]) -> Any:
    if _is_image(value):
        return store_bytes(job_id, run, next(names), png_bytes(value), PNG).as_dict()
    if isinstance(value, (bytes, bytearray, memoryview)):
        return store_bytes(job_id, run, next(blobs), bytes(value), BINARY).as_dict()
    if isinstance(value, dict):
        if bad := [key for key in value if not isinstance(key, str)]:
            raise OutputError(f"predict returned a dict with a non-text key {bad[0]!r}")
        return {key: _stored(item, job_id, run, names, blobs) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [_stored(item, job_id, run, names, blobs) for item in value]
    return value


def _is_image(value: Any) -> bool:
    """A PIL image, or a uint8 array of H x W (x 3 or 4)."""
    if hasattr(value, "save") and hasattr(value, "mode") and hasattr(value, "size"):
        return True
    dtype, shape = getattr(value, "dtype", None), getattr(value, "shape", ())
    return str(dtype) == "uint8" and (len(shape) == 2 or (len(shape) == 3
                                                          and shape[2] in (3, 4)))
