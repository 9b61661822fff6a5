"""Where checkpoints come from: the local model folder, or a remote store.

``GPULANES_MODEL_STORE`` unset: a model's checkpoint lives in
``GPULANES_MODEL_DIR/<name>``. Set to any fsspec URL (``http://host/models``,
``s3://bucket/models``, ``file:///srv/models``), the checkpoint is read from
``<store>/<name>/`` and every shard is fetched once per host into
``GPULANES_MODEL_DIR/<name>``, in parallel, each checked against the
manifest's sha256 before it is kept. A later load (this worker after an
eviction, or another worker on the host) finds the verified copy and fetches
nothing.
"""
from __future__ import annotations

import hashlib
import json
import logging
import os
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from gpu_worker.shards import HASH_CHUNK_BYTES, MANIFEST_NAME
from tasks.errors import ShardError

log = logging.getLogger(__name__)


def _sha256_of(path: Path) -> str | None:
    if not path.exists():
        return None
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        while chunk := fh.read(HASH_CHUNK_BYTES):
            digest.update(chunk)
    return digest.hexdigest()


class RemoteStore:
    """An fsspec-backed checkpoint store with a verified local cache."""

    def __init__(self, url: str, cache_dir: Path, max_workers: int = 8) -> None:
        import fsspec  # only hosts with a remote store need it

        self.url = url.rstrip("/")
        self.fs, self.root = fsspec.core.url_to_fs(self.url)
        self.cache_dir, self.max_workers = Path(cache_dir), max_workers

    def fetch(self, name: str) -> Path:
        """The local folder of checkpoint ``name``, fetching what the cache lacks."""
        began = time.perf_counter()
        remote, local = f"{self.root}/{name}", self.cache_dir / name
        manifest = self._manifest(remote)
        local.mkdir(parents=True, exist_ok=True)
        with ThreadPoolExecutor(max(1, min(self.max_workers, len(manifest["shards"])))) as pool:
            fetched = sum(pool.map(lambda s: self._shard(remote, local, s), manifest["shards"]))
        _replace_bytes(local / MANIFEST_NAME, json.dumps(manifest).encode())
        log.info("checkpoint %s: %d shard(s) fetched from %s in %.0f ms", name, fetched,
                 self.url, (time.perf_counter() - began) * 1000)
        return local

    def _manifest(self, remote: str) -> dict[str, Any]:
        try:
            manifest = json.loads(self.fs.cat_file(f"{remote}/{MANIFEST_NAME}"))
            manifest["shards"]  # noqa: B018  a manifest without shards is no manifest
        except Exception as exc:  # noqa: BLE001  any transport's own error types
            raise ShardError(f"{self.url}: cannot read {remote}/{MANIFEST_NAME} ({exc}); "
                             "is the model published to GPULANES_MODEL_STORE?") from exc
        return manifest

    def _shard(self, remote: str, local: Path, shard: dict[str, Any]) -> int:
        """Fetch one shard unless a verified copy is cached; 1 if it was fetched."""
        target = local / shard["file"]
        if _sha256_of(target) == shard["sha256"]:
            return 0
        try:
            data = self.fs.cat_file(f"{remote}/{shard['file']}")
        except Exception as exc:  # noqa: BLE001
            raise ShardError(f"{remote}/{shard['file']}: cannot fetch ({exc})") from exc
        actual = hashlib.sha256(data).hexdigest()
        if actual != shard["sha256"]:
            raise ShardError(f"{remote}/{shard['file']}: sha256 {actual} does not match the "
                             f"manifest's {shard['sha256']}; republish the checkpoint")
        _replace_bytes(target, data)
        return 1


def _replace_bytes(path: Path, data: bytes) -> None:
    """Write then rename: concurrent fetchers on one host never see half a file."""
    partial = path.with_name(f".{path.name}.{uuid.uuid4().hex}.partial")
    partial.write_bytes(data)
    os.replace(partial, path)


def checkpoint_folder(name: str, model_dir: Path, store_url: str | None) -> Path:
    """The local folder to load ``name`` from: fetched from the store when one is set."""
    if not store_url:
        return Path(model_dir) / name
    return RemoteStore(store_url, model_dir).fetch(name)

