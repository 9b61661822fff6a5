"""A real small disk for tests: a tmpfs of a given size (root only)."""
from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import tempfile
from pathlib import Path
from typing import Iterator

import pytest


def mount_tmpfs(size: str) -> Path:
    """A fresh tmpfs of ``size`` ("1m"); the test is skipped (failed under
    GPULANES_REQUIRE_ROOT_TESTS=1) where this process may not mount one."""
    folder = Path(tempfile.mkdtemp(prefix="gl-disk-", dir="/tmp"))
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs",
                              str(folder)], capture_output=True, text=True)
    if mounted.returncode != 0:
        folder.rmdir()
        reason = (f"cannot mount a {size} tmpfs for a real full disk (needs root): "
                  f"{mounted.stderr.strip()}")
        if os.environ.get("GPULANES_REQUIRE_ROOT_TESTS") == "1":
            pytest.fail(reason)
        pytest.skip(reason)
    return folder


def unmount(folder: Path) -> None:
    """Unmount ``folder`` (lazily if still busy) and remove it."""
    if subprocess.run(["umount", str(folder)], capture_output=True).returncode != 0:
        subprocess.run(["umount", "-l", str(folder)], capture_output=True)
    folder.rmdir()


@contextlib.contextmanager
def tmpfs(size: str) -> Iterator[Path]:
    """A tmpfs of ``size`` for the block, unmounted after it."""
    folder = mount_tmpfs(size)
    try:
        yield folder
    finally:
        unmount(folder)


def fill(folder: Path, leave_bytes: int) -> None:
    """Fill ``folder``'s disk with one file until about ``leave_bytes`` stay free."""
    size = shutil.disk_usage(folder).free - leave_bytes
    (folder / "filler").write_bytes(b"\xff" * max(size, 0))
