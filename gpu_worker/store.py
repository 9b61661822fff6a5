"""Where checkpoints come from: the local model folder, or a remote store.

``GPULANES_MODEL_STORE`` unset: a model's checkpoint lives in
``GPULANES_MODEL_DIR/<name>``. Set to any fsspec URL (``http://host/models``,
``s3://bucket/models``, ``file:///srv/models``), the checkpoint is read from
``<store>/<name>/`` and every shard is fetched once per host into
``GPULANES_MODEL_DIR/<name>``, in parallel, each checked against the
manifest's sha256 before it is kept. A later load (this worker after an
eviction, or another worker on the host) finds the verified copy and fetches
nothing.

The manifest is read from the store once per cluster: the first load pins it
in Redis (:class:`ManifestPins`), and every later load, on any host, takes
the pinned copy. That saves each cold load a store round trip before its
shards can start, and every worker serves the same version of a model, shard
for shard, whatever is published meanwhile. To roll out a new version:
publish it, ``celery -A tasks lanes unpin MODEL``, then restart or prewarm.
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
from pathlib import Path
from typing import Any

import redis

from gpu_worker.shards import HASH_CHUNK_BYTES, MANIFEST_NAME
from routing.names import MANIFESTS_KEY
from tasks.errors import ShardError

log = logging.getLogger(__name__)
#: What to do when the store no longer matches the manifest a load was given.
REPUBLISHED = ("; republish the checkpoint, or if a new version was published, "
               "`celery -A tasks lanes unpin MODEL` (the cluster pins the first manifest)")


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

    def get(self, key: str) -> bytes | None:
        return self.client.hget(MANIFESTS_KEY, key)

    def pin(self, key: str, raw: bytes) -> bytes:
        """Pin ``raw`` unless another load pinned first; the pinned manifest either way."""
        with self.client.pipeline() as pipe:  # MULTI: both or neither
            _, pinned = pipe.hsetnx(MANIFESTS_KEY, key, raw).hget(MANIFESTS_KEY, key).execute()
        return pinned

    def unpin(self, key: str) -> bool:
        return bool(self.client.hdel(MANIFESTS_KEY, key))


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
        manifest = self._pinned_manifest(name, remote)
        local.mkdir(parents=True, exist_ok=True)
        with ThreadPoolExecutor(max(1, min(self.max_workers, len(manifest["shards"])))) as pool:
            fetched = sum(pool.map(lambda s: self._shard(remote, local, s), manifest["shards"]))
        _replace_bytes(local / MANIFEST_NAME, json.dumps(manifest).encode())
        log.info("checkpoint %s: %d shard(s) fetched from %s in %.0f ms", name, fetched,
                 self.url, (time.perf_counter() - began) * 1000)
        return local

    def _pinned_manifest(self, name: str, remote: str) -> dict[str, Any]:
        """The cluster's pinned manifest of ``name``; read from the store and pinned if none."""
        key, where = f"{self.url}/{name}", f"{remote}/{MANIFEST_NAME}"
        try:
            pinned = self.pins.get(key) if self.pins else None
        except redis.RedisError as exc:  # loading must not depend on Redis being up
            log.warning("manifest pins unreachable (%s): reading %s from the store", exc, name)
            pinned, self.pins = None, None
        if pinned is not None:
            return _parse_manifest(pinned, f"{where} (pinned)")
        raw = self._manifest_bytes(remote)
        manifest = _parse_manifest(raw, where)  # never pin what is not a manifest
        with contextlib.suppress(redis.RedisError):
            if self.pins and (pinned := self.pins.pin(key, raw)) != raw:
                manifest = _parse_manifest(pinned, f"{where} (pinned)")  # another load won
        return manifest

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
        partial = target.with_name(f".{target.name}.{uuid.uuid4().hex}.partial")
        try:
            self._download(source, partial, shard["sha256"])
            os.replace(partial, target)
        finally:
            partial.unlink(missing_ok=True)
        return 1

    def _download(self, source: str, partial: Path, sha256: str) -> None:
        try:
            self.fs.get_file(source, str(partial))
        except Exception as exc:  # noqa: BLE001  any transport's own error types
            raise ShardError(f"{source}: cannot fetch ({exc}){REPUBLISHED}") from exc
        actual = _sha256_of(partial)
        if actual != sha256:
            raise ShardError(f"{source}: sha256 {actual} does not match the "
                             f"manifest's {sha256}{REPUBLISHED}")


def _parse_manifest(raw: bytes, where: str) -> dict[str, Any]:
    try:
        manifest = json.loads(raw)
        manifest["shards"]  # noqa: B018  a manifest without shards is no manifest
    except (ValueError, TypeError, KeyError) as exc:
        raise ShardError(f"{where}: not a checkpoint manifest ({exc})") from exc
    return manifest


def _replace_bytes(path: Path, data: bytes) -> None:
    """Write then rename: concurrent fetchers on one host never see half a file."""
    partial = path.with_name(f".{path.name}.{uuid.uuid4().hex}.partial")
    partial.write_bytes(data)
    os.replace(partial, path)


def checkpoint_folder(name: str, model_dir: Path, store_url: str | None) -> Path:
    """The local folder to load ``name`` from: fetched from the store when one is set."""
    if not store_url:
        return Path(model_dir) / name
    return RemoteStore(store_url, model_dir, pins=cluster_pins()).fetch(name)


def cluster_pins() -> ManifestPins:
    """Manifest pins on the cluster's Redis (the broker)."""
    import celeryconfig as cfg
    from routing.store import connect

    return ManifestPins(connect(cfg.broker_url, cfg.SENTINEL_MASTER))

