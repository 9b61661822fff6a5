"""A model's returned dict made into a result's ``output``: images (PIL images, uint8
arrays) encoded as PNG and bytes kept as binary, each a :class:`Blob` to store as an
artifact and then replaced by its reference ``{"url", "media_type", "bytes",
"sha256"}`` (``tasks.jobs.artifacts``); everything else must be JSON. Anything else
fails the job with that reason (:class:`OutputError`), before anything is written, and
the worker goes on serving."""
from __future__ import annotations

import itertools
import json
from dataclasses import dataclass
from typing import Any, Iterator

from tasks.errors import OutputError
from tasks.jobs.artifacts import IMAGE, ArtifactRef
from tasks.worker.png import PNG, png_bytes

BINARY = "application/octet-stream"


@dataclass(frozen=True)
class Blob:
    """One artifact of a run, encoded and held in memory until the store takes it."""

    name: str
    data: bytes
    media_type: str


def encoded_output(output: Any) -> tuple[Any, list[Blob]]:
    """``output`` with its images and bytes replaced by :class:`Blob` s, checked to be
    JSON once they are references; and those blobs, in order."""
    if not isinstance(output, dict):
        raise OutputError(f"predict returned a {type(output).__name__}, not a dict")
    names = (IMAGE if i == 0 else f"{IMAGE}-{i}" for i in itertools.count())
    others = (f"output-{i}" for i in itertools.count())
    blobs: list[Blob] = []
    encoded = _encoded(output, names, others, blobs)
    try:
        json.dumps(encoded, allow_nan=False, default=_as_reference)
    except (TypeError, ValueError) as exc:
        raise OutputError(f"predict returned what JSON cannot hold: {exc}") from exc
    return encoded, blobs


def with_references(encoded: Any, refs: dict[str, ArtifactRef]) -> Any:
    """``encoded`` with each blob replaced by its reference in ``refs`` (by name)."""
    if isinstance(encoded, Blob):
        return refs[encoded.name].as_dict()
    if isinstance(encoded, dict):
        return {key: with_references(item, refs) for key, item in encoded.items()}
    if isinstance(encoded, list):
        return [with_references(item, refs) for item in encoded]
    return encoded


def _as_reference(value: Any) -> Any:
    """For the JSON check: a blob stands for its reference; anything else cannot be."""
    if isinstance(value, Blob):
        return {}
    raise TypeError(f"Object of type {type(value).__name__} is not JSON serializable")


def _encoded(value: Any, names: Iterator[str], others: Iterator[str], blobs: list[Blob]) -> Any:
    if _is_image(value):
        blobs.append(Blob(next(names), png_bytes(value), PNG))
        return blobs[-1]
    if isinstance(value, (bytes, bytearray, memoryview)):
        blobs.append(Blob(next(others), bytes(value), BINARY))
        return blobs[-1]
    if isinstance(value, dict):
        if bad := [key for key in value if not isinstance(key, str)]:
            raise OutputError(f"predict returned a dict with a non-text key {bad[0]!r}")
        return {key: _encoded(item, names, others, blobs) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [_encoded(item, names, others, blobs) for item in value]
    return value


def _is_image(value: Any) -> bool:
    """A PIL image, or a uint8 array of H x W (x 3 or 4)."""
    if hasattr(value, "save") and hasattr(value, "mode") and hasattr(value, "size"):
        return True
    dtype, shape = getattr(value, "dtype", None), getattr(value, "shape", ())
    return str(dtype) == "uint8" and (len(shape) == 2 or (len(shape) == 3
                                                          and shape[2] in (3, 4)))
