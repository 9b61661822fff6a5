"""The full-disk fault of the fault soak (``tests/soak/faults.py``), at full size.

The cluster's workers are restarted writing their artifacts to a 1 MB tmpfs (root
only: skipped otherwise), and ``--full-disk-jobs`` jobs of 100 kB artifacts are
submitted at once. Ten fit; the runs that finish next keep their output in memory and
wait, and the workers step aside. The disk is held full for ``--full-disk-s``: the
workers must not come back meanwhile (the old self-check, a tiny file, brought them
back every 5 s). Then an operator frees it every second until every job is done:
each job's model must have run to its end once. The workers are then restarted as
they were.
"""
from __future__ import annotations

import re
import subprocess
import tempfile
import time
import uuid
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from tests.harness.faults import Counts, settle

BLOB_BYTES = 100_000
DISK = "1m"
BLOB_MODEL = "blob=tests.blob_model:Blob"


def full_disk(args: Any, cluster: Any, app: Any, client: Any) -> Counts:
    """The scenario (see the module's docstring); counted as every other one, plus how
    often a worker came back while the disk was full and how many models ran twice."""
    disk = _mount(DISK)
    if disk is None:
        return Counts("full disk: skipped (mounting a tmpfs needs root)", 0, 0, 0, 0, 0,
                      0, 0, 0, 0.0)
    before = dict(cluster.env)
    try:
        _restart_workers(cluster, app, {**before, "GPULANES_ARTIFACT_DIR": str(disk),
                                        "GPULANES_MODELS": _with_blob(before)})
        return _run(args, cluster, client, disk)
    finally:
        _restart_workers(cluster, app, before)
        _unmount(disk)


def _run(args: Any, cluster: Any, client: Any, disk: Path) -> Counts:
    from tasks import submit
    from tasks.settings import override, settings
    from tests.blob_model import runs_finished

    log, batch = Path(cluster.log_dir) / "workers.log", uuid.uuid4().hex[:8]
    tags = [f"{batch}-{i}" for i in range(args.full_disk_jobs)]
    logged_before = log.stat().st_size
    with override(models={**settings.models, "blob": BLOB_MODEL.split("=", 1)[1]}):
        started_at = time.monotonic()
        accepted = {r.id: r for r in (submit(model="blob", tag=tag, size_bytes=BLOB_BYTES)
                                      for tag in tags)}
    full_at = _logged_at(log, logged_before, b"stepping aside", timeout_s=120)
    time.sleep(args.full_disk_s)  # the fault itself: the disk stays full this long
    held = _since(log, full_at)
    _free_until_done(disk, list(accepted.values()), timeout_s=600)
    stream = SimpleNamespace(accepted=accepted, submitted=len(tags), refused={},
                             started_at=started_at, slowest_refusal_s=0.0)
    counts = settle(stream, "", client, 60)
    twice = sum(runs_finished(tag) > 1 for tag in tags)
    counts.scenario = (
        f"1 MB artifact disk held full {args.full_disk_s:g}s under {len(tags)} jobs of "
        f"100 kB (back while full: {held.count('serving again')}; self-checks failed "
        f"meanwhile: {held.count('self-check failed')}, waits "
        f"{_delays(held)}; models run twice to the end: {twice})")
    counts.duplicated += twice
    return counts


def _with_blob(env: dict[str, str]) -> str:
    from tasks.settings import settings

    models = env.get("GPULANES_MODELS") or ",".join(f"{k}={v}" for k, v in
                                                    settings.models.items())
    return f"{models},{BLOB_MODEL}" if "blob=" not in models else models


def _restart_workers(cluster: Any, app: Any, env: dict[str, str]) -> None:
    cluster.stop_workers()
    cluster.env = env
    cluster.start_workers()
    cluster.wait_for_workers(app, cluster.hostnames, 120)


def _logged_at(log: Path, offset: int, words: bytes, timeout_s: float) -> int:
    """Where in the log ``words`` first appear past ``offset`` (waited for up to
    ``timeout_s``; else the log's end)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        with open(log, "rb") as file:
            file.seek(offset)
            if (found := file.read().find(words)) >= 0:
                return offset + found
        time.sleep(0.2)
    return log.stat().st_size


def _since(log: Path, offset: int) -> str:
    with open(log, "rb") as file:
        file.seek(offset)
        return file.read().decode(errors="replace")


def _delays(text: str) -> str:
    return ",".join(re.findall(r"next self-check in ([0-9.]+)s", text)[:8]) or "-"


def _free_until_done(disk: Path, results: list[Any], timeout_s: float) -> None:
    """As an operator would: delete the written artifacts every second until every job
    is done (the results name them; nothing reads them here)."""
    deadline = time.monotonic() + timeout_s
    while not all(r.ready() for r in results) and time.monotonic() < deadline:
        for artifact in disk.glob("*.bin"):
            artifact.unlink(missing_ok=True)
        time.sleep(1.0)


def _mount(size: str) -> Path | None:
    folder = Path(tempfile.mkdtemp(prefix="gl-soak-disk-", dir="/tmp"))
    if subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(folder)],
                      capture_output=True).returncode == 0:
        return folder
    folder.rmdir()
    return None


def _unmount(folder: Path) -> None:
    if subprocess.run(["umount", str(folder)], capture_output=True).returncode != 0:
        subprocess.run(["umount", "-l", str(folder)], capture_output=True)
    folder.rmdir()
