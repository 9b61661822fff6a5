"""Artifact expiry: artifacts older than ``artifact_ttl_s`` (as long as a result may
name them: the result TTL plus the result cache's) are deleted from the
store.

Every worker sweeps the store it writes to (``settings.artifact_root``), from its own
thread: a local folder lives on the worker's host, where beat cannot reach. A pass
lists the store once (a local folder lazily; an fsspec store in one listing) and each
round looks at the next ``batch`` entries of it, so no round does more than a batch of
work; rounds follow each other every second until the pass is over, then rest a period.
Only names artifacts have (and probes and partial writes a killed process left) are
touched, and never one younger than the TTL.
"""
from __future__ import annotations

import contextlib
import itertools
import logging
import os
import random
import re
import stat
import threading
import time
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Iterator

from tasks.jobs.artifacts import ARTIFACT_FILE, PROBE_PREFIX, filesystem, local_folder
from tasks.settings import settings

log = logging.getLogger(__name__)
#: Entries one round looks at.
SWEEP_BATCH = 500
#: Rest between two passes (a quarter of the TTL when that is shorter).
SWEEP_EVERY_S = 60.0
#: Pause between the rounds of one pass.
SWEEP_ROUND_S = 1.0
#: The sweep's own draws (its jitter): the random module's shared state is left alone.
_JITTER = random.Random()
#: Names the sweep may delete: artifacts, probes, and partial writes (``.<name>.<hex>.partial``).
SWEPT = re.compile(rf"(?:{ARTIFACT_FILE.pattern}|{re.escape(PROBE_PREFIX)}[0-9a-f]{{32}}"
                   rf"|\..+\.[0-9a-f]{{32}}\.partial)")
#: Keys of an fsspec listing's entry that date it, most telling first.
DATE_KEYS = ("mtime", "LastModified", "last_modified", "updated", "modified", "created")


@dataclass(frozen=True)
class Entry:
    """One name in the store; ``mtime_s`` (unix) only for a file the sweep may delete."""

    path: str
    mtime_s: float | None


class Sweeper:
    """Deletes expired artifacts from store ``root`` (default: the settings' one), a
    bounded ``batch`` of entries per :meth:`round`."""

    def __init__(self, root: str | None = None, ttl_s: float | None = None,
                 batch: int = SWEEP_BATCH) -> None:
        self.root, self.ttl_s, self.batch = root, ttl_s, batch
        self._pass: Iterator[Entry] | None = None
        self._pass_root = ""

    def round(self, now_s: float | None = None) -> tuple[int, bool]:
        """Look at the next ``batch`` entries of this pass (a new pass once the last
        ended) and delete the expired ones: (how many were deleted, whether the pass
        is over)."""
        root = self.root or settings.artifact_root
        if self._pass is None or self._pass_root != root:
            self._pass, self._pass_root = _listing(root), root
        taken = list(itertools.islice(self._pass, self.batch))
        over = len(taken) < self.batch
        if over:
            self._pass = None
        oldest_s = (time.time() if now_s is None else now_s) - (self.ttl_s
                                                                or settings.artifact_ttl_s)
        expired = [e.path for e in taken if e.mtime_s is not None and e.mtime_s < oldest_s]
        _remove(root, expired)
        return len(expired), over

    def run_forever(self) -> None:
        """Rounds until the process ends: a second apart during a pass, a period
        (jittered, so workers sharing a store do not sweep in step) between passes."""
        while True:
            try:
                deleted, over = self.round()
                if deleted:
                    log.info("deleted %d expired artifacts", deleted)
            except Exception:  # noqa: BLE001  a store away now may answer next round
                log.warning("artifact sweep failed; trying again later", exc_info=True)
                over = True
            time.sleep(self.rest_s() * _JITTER.uniform(0.5, 1.0) if over else SWEEP_ROUND_S)

    def rest_s(self) -> float:
        """Rest between passes: SWEEP_EVERY_S, or a quarter of the TTL when shorter."""
        return max(SWEEP_ROUND_S, min(SWEEP_EVERY_S, (self.ttl_s or settings.artifact_ttl_s) / 4))

    def start(self) -> threading.Thread:
        """Sweep from a daemon thread of this process."""
        thread = threading.Thread(target=self.run_forever, name="artifact-sweep", daemon=True)
        thread.start()
        return thread


def _listing(root: str) -> Iterator[Entry]:
    folder = local_folder(root)
    return _local_entries(folder) if folder is not None else _store_entries(root)


def _local_entries(folder: Path) -> Iterator[Entry]:
    """The folder's entries, read lazily (one ``stat`` each, only for a sweepable name)."""
    try:
        with os.scandir(folder) as entries:
            for entry in entries:
                yield Entry(entry.path, _local_mtime_s(entry))
    except FileNotFoundError:  # no artifact written yet
        return


def _local_mtime_s(entry: os.DirEntry) -> float | None:
    if not SWEPT.fullmatch(entry.name):
        return None
    try:
        found = entry.stat(follow_symlinks=False)
    except FileNotFoundError:
        return None
    return found.st_mtime if stat.S_ISREG(found.st_mode) else None


def _store_entries(root: str) -> Iterator[Entry]:
    """The store's entries under ``root``: one fresh listing, taken as the pass begins."""
    fs, path = filesystem(root)
    fs.invalidate_cache(path)  # a cached listing would hide what others wrote
    try:
        infos = fs.ls(path, detail=True)
    except FileNotFoundError:
        return
    for info in infos:
        name = info["name"].rstrip("/").rpartition("/")[2]
        sweepable = info.get("type") == "file" and SWEPT.fullmatch(name)
        yield Entry(info["name"], _store_mtime_s(fs, info) if sweepable else None)


def _store_mtime_s(fs: Any, info: dict[str, Any]) -> float | None:
    """When an entry was last written, from its listing (or asked of the store)."""
    for key in DATE_KEYS:
        if (when := _unix_s(info.get(key))) is not None:
            return when
    try:
        return _unix_s(fs.modified(info["name"]))
    except Exception:  # noqa: BLE001  undated: never deleted
        return None


def _unix_s(value: Any) -> float | None:
    if isinstance(value, str):
        with contextlib.suppress(ValueError):
            value = datetime.fromisoformat(value.replace("Z", "+00:00"))
    if isinstance(value, datetime):
        return (value if value.tzinfo else value.replace(tzinfo=timezone.utc)).timestamp()
    return float(value) if isinstance(value, (int, float)) else None


def _remove(root: str, paths: list[str]) -> None:
    if not paths:
        return
    if local_folder(root) is not None:
        for path in paths:
            with contextlib.suppress(FileNotFoundError):  # another worker swept it first
                os.unlink(path)
        return
    fs, _ = filesystem(root)
    for path in paths:
        with contextlib.suppress(FileNotFoundError):
            fs.rm_file(path)
