"""A sharded checkpoint on disk: safetensors shards plus a ``manifest.json``.

Layout of a checkpoint folder::

    manifest.json          format version, metadata, and per shard: file name,
                           sha256, byte size and the tensor names it holds
    shard-00000-of-00004.safetensors
    ...

A checkpoint is published whole by renaming a finished temp folder into
place, so a reader sees either no folder or a complete one. Loading checks
every shard against the manifest before any tensor is used, and either
returns every tensor or raises ``ShardError``: never a partial dict.
"""
from __future__ import annotations

import hashlib
import json
import logging
import os
import re
import shutil
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file, save_file

from tasks.errors import ShardError

log = logging.getLogger(__name__)

MANIFEST_NAME = "manifest.json"
FORMAT_VERSION = 1
HASH_CHUNK_BYTES = 1 << 20


def write_checkpoint(tensors: dict[str, torch.Tensor], dest: Path, n_shards: int,
                     metadata: dict[str, Any] | None = None) -> Path:
    """Write ``tensors`` as ``n_shards`` safetensors files under ``dest``; return ``dest``.

    Safe when several processes build the same checkpoint at once: each
    writes a private temp folder beside ``dest`` and renames it into place;
    the first rename wins and the others discard their copy.
    """
    if n_shards < 1:
        raise ValueError(f"n_shards must be at least 1, got {n_shards}")
    dest = Path(dest)
    dest.parent.mkdir(parents=True, exist_ok=True)
    # Same filesystem as dest, so the final rename is atomic.
    tmp = Path(tempfile.mkdtemp(prefix=f".{dest.name}.tmp-", dir=dest.parent))
    try:
        shards = [_write_shard(tmp, i, n_shards, group)
                  for i, group in enumerate(_balance(tensors, n_shards))]
        manifest = {"format_version": FORMAT_VERSION, "metadata": metadata or {},
                    "shards": shards}
        _write_synced(tmp / MANIFEST_NAME, json.dumps(manifest, indent=2).encode())
        won = _publish(tmp, dest)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    if not won:
        shutil.rmtree(tmp, ignore_errors=True)
    return dest


def _balance(tensors: dict[str, torch.Tensor], n_shards: int) -> list[dict[str, torch.Tensor]]:
    """Largest tensor first into the lightest shard; deterministic for equal sizes."""
    groups: list[dict[str, torch.Tensor]] = [{} for _ in range(n_shards)]
    loads = [0] * n_shards
    by_size = sorted(tensors.items(), key=lambda kv: (-_nbytes(kv[1]), kv[0]))
    for name, tensor in by_size:
        lightest = loads.index(min(loads))
        groups[lightest][name] = tensor
        loads[lightest] += _nbytes(tensor)
    return groups


def _nbytes(tensor: torch.Tensor) -> int:
    return tensor.numel() * tensor.element_size()


def _write_shard(folder: Path, index: int, n_shards: int,
                 group: dict[str, torch.Tensor]) -> dict[str, Any]:
    file_name = f"shard-{index:05d}-of-{n_shards:05d}.safetensors"
    path = folder / file_name
    save_file({k: v.detach().to("cpu").contiguous() for k, v in group.items()}, str(path))
    with open(path, "rb+") as fh:
        os.fsync(fh.fileno())
    return {"file": file_name, "sha256": _sha256(path), "size_bytes": path.stat().st_size,
            "tensors": sorted(group)}


def _write_synced(path: Path, data: bytes) -> None:
    with open(path, "wb") as fh:
        fh.write(data)
        fh.flush()
        os.fsync(fh.fileno())


def _publish(tmp: Path, dest: Path) -> bool:
    """Rename ``tmp`` to ``dest``; False when another writer got there first."""
    try:
        os.rename(tmp, dest)
        return True
    except OSError as exc:
        # Renaming onto a non-empty folder fails: another process published
        # first, and its checkpoint is as good as ours.
        if (dest / MANIFEST_NAME).exists():
            return False
        raise ShardError(f"{dest}: cannot publish the checkpoint ({exc}); "
                         f"if {dest} holds no {MANIFEST_NAME}, delete it to rebuild") from exc


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        while chunk := fh.read(HASH_CHUNK_BYTES):
            digest.update(chunk)
    return digest.hexdigest()


def read_manifest(path: Path) -> dict[str, Any]:
    """Return the parsed ``manifest.json`` of checkpoint folder ``path``."""
    manifest_path = Path(path) / MANIFEST_NAME
    fix = f"delete {path} to rebuild the checkpoint"
    try:
        raw = manifest_path.read_text()
    except OSError as exc:
        raise ShardError(f"{manifest_path}: missing or unreadable manifest ({exc}); "
                         f"{fix}") from exc
    return parse_manifest(raw, str(manifest_path), fix)


#: A file of a checkpoint: plain names (each starting with a letter or digit, so never
#: ``..``) joined by ``/``, relative to the checkpoint's folder: a saved pipeline keeps
#: its parts in sub-folders (``unet/config.json``).
_NAME = r"[A-Za-z0-9][A-Za-z0-9._-]{0,200}"
SHARD_PATH = re.compile(rf"{_NAME}(/{_NAME}){{0,7}}")
_SHA256 = re.compile(r"[0-9a-f]{64}")


def parse_manifest(raw: str | bytes, where: str, fix: str) -> dict[str, Any]:
    """A manifest's JSON, checked entry by entry; ``ShardError`` (ending in ``fix``) if not.

    Shard files must be plain names, or plain names under sub-folders, so a manifest
    can never make a loader read or write outside the checkpoint's folder.
    """
    try:
        manifest = json.loads(raw)
        version, shards = manifest["format_version"], manifest["shards"]
        if version != FORMAT_VERSION or not isinstance(shards, list):
            raise ValueError(f"unsupported format version {version!r}")
        for shard in shards:
            _check_shard(shard)
        _check_layout([str(shard["file"]) for shard in shards])
    except (ValueError, KeyError, TypeError) as exc:
        raise ShardError(f"{where}: not a usable checkpoint manifest ({exc}); {fix}") from exc
    return manifest


def _check_shard(shard: Any) -> None:
    if not SHARD_PATH.fullmatch(str(shard["file"])):
        raise ValueError(f"shard file {shard['file']!r} is not a plain file name "
                         "(or one under plain sub-folder names)")
    if not _SHA256.fullmatch(str(shard["sha256"])):
        raise ValueError(f"shard {shard['file']!r}: sha256 {shard['sha256']!r} is not a digest")
    if not all(isinstance(name, str) for name in shard.get("tensors", [])):
        raise ValueError(f"shard {shard['file']!r}: tensor names must be strings")


def _check_layout(files: list[str]) -> None:
    """No file named twice, and none that is also another's folder (``unet``, ``unet/a``)."""
    if twice := sorted(f for f in set(files) if files.count(f) > 1):
        raise ValueError(f"shard file {twice[0]!r} is named twice")
    folders = {"/".join(parts[:i]) for parts in (f.split("/") for f in files)
               for i in range(1, len(parts))}
    if clash := sorted(folders & set(files)):
        raise ValueError(f"{clash[0]!r} is both a shard file and a folder of others")


def load_checkpoint(path: Path, device: str, max_workers: int = 8,
                    verify: bool = True) -> dict[str, torch.Tensor]:
    """Load every tensor of checkpoint ``path`` onto ``device``, shards in parallel.

    Raises ``ShardError`` naming the shard when anything is missing, corrupt
    or unreadable. ``verify=False`` skips the sha256 pass, for a folder the
    caller has just verified (``gpu_worker.store`` does, shard by shard).
    """
    return load_checkpoint_timed(path, device, max_workers, verify)[0]


def load_checkpoint_timed(path: Path, device: str, max_workers: int = 8,
                          verify: bool = True) -> tuple[dict[str, torch.Tensor], float]:
    """``load_checkpoint``, also returning the wall time it took in milliseconds."""
    start_s = time.perf_counter()
    path = Path(path)
    shards = read_manifest(path)["shards"]
    target = torch.device(device)
    with ThreadPoolExecutor(max_workers=max(1, min(max_workers, len(shards) or 1)),
                            thread_name_prefix="shard-load") as pool:
        futures = [pool.submit(_load_shard, path, shard, target, verify) for shard in shards]
        results = [f.result() for f in futures]  # first failure raises; no partial dict
    tensors: dict[str, torch.Tensor] = {}
    for shard_tensors in results:
        tensors.update(shard_tensors)
    if target.type == "cuda":
        torch.cuda.synchronize(target)  # the non_blocking copies must land first
    load_ms = (time.perf_counter() - start_s) * 1000
    log.info("loaded %d tensors from %d shards of %s in %.1f ms",
             len(tensors), len(shards), path, load_ms)
    return tensors, load_ms


def _load_shard(folder: Path, shard: dict[str, Any], target: torch.device,
                verify: bool = True) -> dict[str, torch.Tensor]:
    """Verify one shard against the manifest, then load it; runs in a pool thread."""
    file_path = folder / str(shard.get("file"))
    fix = f"delete {folder} to rebuild the checkpoint"
    try:
        # Shards are immutable once published, so hashing then loading is safe.
        actual = _sha256(file_path) if verify else shard["sha256"]
        if actual != shard["sha256"]:
            raise ShardError(f"{file_path}: sha256 {actual} does not match the manifest's "
                             f"{shard['sha256']}; the shard is corrupt, {fix}")
        loaded = load_file(str(file_path), device="cpu")
    except ShardError:
        raise
    except (OSError, SafetensorError, KeyError, ValueError, RuntimeError) as exc:
        raise ShardError(f"{file_path}: missing or unreadable shard ({exc}); {fix}") from exc
    expected = set(shard.get("tensors", []))
    if set(loaded) != expected:
        raise ShardError(f"{file_path}: tensors {sorted(expected ^ set(loaded))} differ from "
                         f"the manifest; {fix}")
    return _to_device(loaded, target)


def _to_device(tensors: dict[str, torch.Tensor], target: torch.device) -> dict[str, torch.Tensor]:
    if target.type != "cuda":
        return tensors
    # Pinned host memory lets the copies run asynchronously; the caller syncs.
    return {k: v.pin_memory().to(target, non_blocking=True) for k, v in tensors.items()}
