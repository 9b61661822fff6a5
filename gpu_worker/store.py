"""Where checkpoints come from: the local model folder, or a remote store.

``GPULANES_MODEL_STORE`` unset: a model's checkpoint lives in
``GPULANES_MODEL_DIR/<name>``. Set to any fsspec URL (``http://host/models``,
``s3://bucket/models``, ``file:///srv/models``), the checkpoint is read from
``<store>/<name>/`` and every shard is fetched once per host into
``GPULANES_MODEL_DIR/<name>``, in parallel, streamed to disk and checked
against the manifest's sha256 before it is kept. A later load (this worker
after an eviction, or another worker on the host) finds the verified copy and
fetches nothing.

The manifest is read from the store once per cluster: the first load pins it
in Redis under the model's name (:class:`ManifestPins`), and every later load,
on any host, takes the pinned copy. That saves each cold load a store round
trip before its shards can start, and every worker serves the same version of
a model, shard for shard, whatever is published meanwhile. To roll out a new
version: publish it, ``celery -A tasks lanes unpin MODEL``, restart the
workers. Without Redis a load reads the store's manifest and pins nothing.
"""
from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from functools import lru_cache
from pathlib import Path
from typing import Any

import redis

from gpu_worker.shards import (
    FORMAT_VERSION,
    HASH_CHUNK_BYTES,
    MANIFEST_NAME,
    SHARD_PATH,
    parse_manifest,
    read_manifest,
)
from tasks.broker.keys import MANIFESTS_KEY
from tasks.errors import ShardError

log = logging.getLogger(__name__)
#: A download left behind by a killed process is removed after this long.
STALE_PARTIAL_S = 600


def _sha256_of(path: Path) -> str | None:
    if not path.exists():
        return None
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        while chunk := fh.read(HASH_CHUNK_BYTES):
            digest.update(chunk)
    return digest.hexdigest()


class ManifestPins:
    """The manifest each model was first loaded with, shared by the cluster in Redis."""

    def __init__(self, client: redis.Redis) -> None:
        self.client = client

    def get(self, model: str) -> str | bytes | None:
        return self.client.hget(MANIFESTS_KEY, model)

    def pin(self, model: str, manifest_json: str) -> str | bytes:
        """Pin ``manifest_json`` unless another load pinned first; the pinned one either way."""
        with self.client.pipeline() as pipe:  # MULTI: both or neither
            _, pinned = (pipe.hsetnx(MANIFESTS_KEY, model, manifest_json)
                         .hget(MANIFESTS_KEY, model).execute())
        return pinned

    def unpin(self, model: str) -> bool:
        return bool(self.client.hdel(MANIFESTS_KEY, model))


class RemoteStore:
    """An fsspec-backed checkpoint store with a verified local cache.

    With ``pins``, the manifest comes from the cluster's pinned copy when
    there is one (see the module's docstring); without, from the store.
    """

    def __init__(self, url: str, cache_dir: Path, max_workers: int = 8,
                 pins: ManifestPins | None = None) -> None:
        import fsspec  # only hosts with a remote store need it

        self.url = url.rstrip("/")
        self.fs, self.root = fsspec.core.url_to_fs(self.url)
        self.cache_dir, self.max_workers, self.pins = Path(cache_dir), max_workers, pins

    def fetch(self, name: str) -> Path:
        """The local folder of checkpoint ``name``, fetching what the cache lacks."""
        began = time.perf_counter()
        remote, local = f"{self.root}/{name}", self.cache_dir / name
        manifest = self._manifest(name, remote)
        local.mkdir(parents=True, exist_ok=True)
        _drop_stale_partials(local)
        with ThreadPoolExecutor(max(1, min(self.max_workers, len(manifest["shards"])))) as pool:
            fetched = sum(pool.map(lambda s: self._shard(remote, local, s), manifest["shards"]))
        _replace_bytes(local / MANIFEST_NAME, json.dumps(manifest).encode())
        log.info("checkpoint %s: %d shard(s) fetched from %s in %.0f ms", name, fetched,
                 self.url, (time.perf_counter() - began) * 1000)
        return local

    def _manifest(self, name: str, remote: str) -> dict[str, Any]:
        """The cluster's pinned manifest of ``name``; read from the store and pinned if none."""
        where, unpin = f"{remote}/{MANIFEST_NAME}", f"`celery -A tasks lanes unpin {name}`"
        pinned = self._pinned(name)
        if pinned is None:
            manifest = parse_manifest(self._manifest_bytes(remote), where,
                                      "republish the checkpoint")
            if not self.pins:
                return manifest
            canonical = json.dumps(manifest, sort_keys=True)  # never pin what is not a manifest
            with contextlib.suppress(redis.RedisError):
                pinned = self.pins.pin(name, canonical)  # another load may have pinned first
            if pinned in (None, canonical):
                return manifest
        return parse_manifest(pinned, f"{where} as pinned in Redis",
                              f"{unpin} to read the store's manifest again")

    def _pinned(self, name: str) -> str | bytes | None:
        try:
            return self.pins.get(name) if self.pins else None
        except redis.RedisError as exc:  # loading must not depend on Redis being up
            log.warning("manifest pins unreachable (%s): reading %s from the store", exc, name)
            self.pins = None
            return None

    def _manifest_bytes(self, remote: str) -> bytes:
        try:
            return self.fs.cat_file(f"{remote}/{MANIFEST_NAME}")
        except Exception as exc:  # noqa: BLE001  any transport's own error types
            raise ShardError(f"{self.url}: cannot read {remote}/{MANIFEST_NAME} ({exc}); "
                             "is the model published to GPULANES_MODEL_STORE?") from exc

    def _shard(self, remote: str, local: Path, shard: dict[str, Any]) -> int:
        """Fetch one shard unless a verified copy is cached; 1 if it was fetched.

        It streams to a file beside the target (never whole in memory: shards
        can be gigabytes), is verified there, and only then renamed into place,
        so concurrent fetchers on one host never see half a shard.
        """
        target, source = local / shard["file"], f"{remote}/{shard['file']}"
        if _sha256_of(target) == shard["sha256"]:
            return 0
        target.parent.mkdir(parents=True, exist_ok=True)  # a saved pipeline's sub-folders
        partial = target.with_name(f".{target.name}.{uuid.uuid4().hex}.partial")
        try:
            self._download(source, partial, shard["sha256"])
            os.replace(partial, target)
        except OSError as exc:  # a folder in the way, a full disk: the load's own error
            raise ShardError(f"{target}: cannot keep {source} ({exc})") from exc
        finally:
            partial.unlink(missing_ok=True)
        return 1

    def _download(self, source: str, partial: Path, sha256: str) -> None:
        republished = ("; the store no longer holds the version this load was given: "
                       "republish it, or `celery -A tasks lanes unpin` the model")
        try:
            self.fs.get_file(source, str(partial))
        except FileNotFoundError as exc:
            raise ShardError(f"{source}: not in the store{republished}") from exc
        except Exception as exc:  # noqa: BLE001  any transport's own error types
            raise ShardError(f"{source}: cannot fetch ({type(exc).__name__}: {exc})") from exc
        actual = _sha256_of(partial)
        if actual != sha256:
            raise ShardError(f"{source}: sha256 {actual} does not match the "
                             f"manifest's {sha256}{republished}")


def _drop_stale_partials(folder: Path) -> None:
    """Remove downloads a killed process left (a live one renames or removes its own)."""
    for partial in folder.rglob(".*.partial"):
        with contextlib.suppress(OSError):
            if time.time() - partial.stat().st_mtime > STALE_PARTIAL_S:
                partial.unlink()


def _replace_bytes(path: Path, data: bytes) -> None:
    """Write then rename: concurrent fetchers on one host never see half a file."""
    partial = path.with_name(f".{path.name}.{uuid.uuid4().hex}.partial")
    partial.write_bytes(data)
    os.replace(partial, path)


def publish_folder(folder: Path, store_url: str, name: str) -> dict[str, Any]:
    """Publish a saved model folder (what ``save_pretrained`` writes, sub-folders and
    all; or a gpulanes checkpoint, with its own manifest) to the store as checkpoint
    ``name``; the manifest published. The files go first and the manifest last, so a
    load never starts from a manifest whose files are not there."""
    import fsspec

    folder = Path(folder)
    if not SHARD_PATH.fullmatch(name):
        raise ShardError(f"checkpoint name {name!r}: use plain names (letters, digits, "
                         "._-) joined by /")
    manifest = _manifest_of(folder)
    fs, root = fsspec.core.url_to_fs(store_url.rstrip("/"))
    for shard in manifest["shards"]:
        target = f"{root}/{name}/{shard['file']}"
        fs.makedirs(target.rsplit("/", 1)[0], exist_ok=True)
        fs.put_file(str(folder / shard["file"]), target)
    fs.pipe_file(f"{root}/{name}/{MANIFEST_NAME}", json.dumps(manifest, indent=2).encode())
    return manifest


def _manifest_of(folder: Path) -> dict[str, Any]:
    """A checkpoint's own manifest, its files checked against it; else one made for
    every file of the folder (hidden ones left out)."""
    if (folder / MANIFEST_NAME).exists():
        manifest = read_manifest(folder)
        for shard in manifest["shards"]:
            if _sha256_of(folder / shard["file"]) != shard["sha256"]:
                raise ShardError(f"{folder / shard['file']}: missing, or not what "
                                 f"{folder / MANIFEST_NAME} says; rebuild the checkpoint")
        return manifest
    files = sorted(p for p in folder.rglob("*") if p.is_file()
                   and not any(part.startswith(".") for part in p.relative_to(folder).parts))
    manifest = {"format_version": FORMAT_VERSION, "metadata": {"published_from": folder.name},
                "shards": [{"file": p.relative_to(folder).as_posix(), "sha256": _sha256_of(p),
                            "size_bytes": p.stat().st_size} for p in files]}
    return parse_manifest(json.dumps(manifest), str(folder),
                          "rename it to letters, digits and ._- (a folder's too)")


def checkpoint_folder(name: str, model_dir: Path, store_url: str | None) -> Path:
    """The local folder to load ``name`` from: fetched from the store when one is set."""
    if not store_url:
        return Path(model_dir) / name
    return RemoteStore(store_url, model_dir, pins=cluster_pins()).fetch(name)


@lru_cache(maxsize=1)
def cluster_pins() -> ManifestPins:
    """Manifest pins on the cluster's Redis (the broker); one client per process."""
    from tasks.broker.store import broker_client

    return ManifestPins(broker_client())
