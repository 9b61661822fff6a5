"""A prediction's artifacts through the API, to its owner's key only.

A result names its artifacts by their place in the store (a path, an ``s3://`` URL),
which no caller can (or should) reach. The API shows each under its prediction instead,
``/v1/predictions/{id}/files/{name}`` (``image.png``, ``image-1.png``, ``output-0.bin``:
the worker's name of it, never anything a caller typed), and serves it only to a key of
the prediction's account; the store's address is never shown.
"""
from __future__ import annotations

import os
import re
from collections.abc import Iterator, Mapping
from typing import Any

from starlette.responses import FileResponse, Response, StreamingResponse

from tasks.errors import ArtifactError
from tasks.front.errors import Refused
from tasks.jobs.artifacts import EXTENSIONS, IMAGE, open_artifact

#: The fields of an artifact reference in a result's ``output`` (``tasks.jobs.artifacts``).
REFERENCE_FIELDS = frozenset({"url", "media_type", "bytes", "sha256"})
#: A stored artifact's file: ``<job id>[-<run>][-<name>].<ext>``.
STORED = re.compile(r"[0-9a-f-]{36}(?:-\d+)?(?:-(?P<name>[a-z][a-z0-9_-]{0,63}))?"
                    r"\.(?P<ext>[a-z0-9]{1,5})")
#: Bytes read from the store per chunk sent.
CHUNK_BYTES = 1 << 16
#: An artifact is the model's output, not a page of this API: never sniffed, never run.
SAFE_HEADERS = {"X-Content-Type-Options": "nosniff", "Content-Security-Policy": "sandbox",
                "Cache-Control": "private, max-age=3600"}


def api_name(url: str, media_type: str) -> str:
    """The name an artifact stored at ``url`` has under its prediction: the worker's
    name of it and its extension (``image.png``)."""
    found = STORED.fullmatch(url.rsplit("/", 1)[-1])
    if found is None:
        return f"file.{EXTENSIONS.get(media_type, 'bin')}"
    return f"{found['name'] or IMAGE}.{found['ext']}"


def artifacts(result: Mapping[str, Any]) -> dict[str, dict[str, Any]]:
    """A result's artifacts by their name under the prediction, each a reference:
    an image model's ``image``, and every reference in a class model's ``output``."""
    found: dict[str, dict[str, Any]] = {}
    if isinstance(result.get("image"), str):
        _add(found, {"url": result["image"], "media_type": "image/png",
                     "bytes": result.get("bytes"), "sha256": result.get("sha256")})
    for ref in _references(result.get("output")):
        _add(found, ref)
    return found


def _add(found: dict[str, dict[str, Any]], ref: dict[str, Any]) -> None:
    if any(kept["url"] == ref["url"] for kept in found.values()):
        return
    name = base = api_name(ref["url"], ref.get("media_type", ""))
    while name in found:  # two names alike (never from one run): keep both apart
        stem, _, ext = base.rpartition(".")
        name = f"{stem}-{len(found)}.{ext}"
    found[name] = ref


def _references(value: Any) -> Iterator[dict[str, Any]]:
    if isinstance(value, Mapping) and REFERENCE_FIELDS <= set(value) \
            and isinstance(value["url"], str):
        yield dict(value)
    elif isinstance(value, Mapping):
        for item in value.values():
            yield from _references(item)
    elif isinstance(value, list):
        for item in value:
            yield from _references(item)


def shown(value: Any, urls: Mapping[str, str]) -> Any:
    """``value`` with each reference's store address replaced by its API URL
    (``urls``: store address -> API URL)."""
    if isinstance(value, Mapping) and REFERENCE_FIELDS <= set(value) \
            and value.get("url") in urls:
        return {**value, "url": urls[value["url"]]}
    if isinstance(value, Mapping):
        return {key: shown(item, urls) for key, item in value.items()}
    if isinstance(value, list):
        return [shown(item, urls) for item in value]
    return value


def served(ref: Mapping[str, Any]) -> Response:
    """The artifact ``ref`` names, as a response: a local file as it is, any other
    store's object in chunks. 404 when the store no longer has it."""
    url, media_type = ref["url"], ref.get("media_type") or "application/octet-stream"
    headers = {**SAFE_HEADERS, **({"ETag": f'"{ref["sha256"]}"'} if ref.get("sha256") else {})}
    if "://" not in url:
        if not os.path.isfile(url):
            raise Refused(404, "the artifact is no longer in the store")
        return FileResponse(url, media_type=media_type, headers=headers)
    try:
        file = open_artifact(ref)
    except (OSError, ArtifactError) as exc:
        raise Refused(404, "the artifact is no longer in the store") from exc
    return StreamingResponse(_chunks(file), media_type=media_type, headers=headers)


def _chunks(file: Any) -> Iterator[bytes]:
    with file:
        while block := file.read(CHUNK_BYTES):
            yield block
