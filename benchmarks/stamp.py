"""The ``meta`` stamp every benchmark's JSON carries: commit, date, machine, versions, command."""
from __future__ import annotations

import os
import platform
import shlex
import subprocess
import sys
from datetime import datetime, timezone
from importlib import metadata
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
#: packages whose versions decide the figures
PACKAGES = ("celery", "kombu", "redis")


def stamp() -> dict[str, Any]:
    """Where and how a run was made, for the ``meta`` block of its JSON."""
    return {
        "commit": commit(),
        "date": datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "machine": machine(),
        "versions": {"python": platform.python_version(),
                     **{name: version(name) for name in PACKAGES}},
        "command": command(),
    }


def commit() -> str | None:
    """The short hash of HEAD, with ``+dirty`` when the tree has uncommitted changes."""
    def git(*args: str) -> str:
        return subprocess.run(["git", "-C", str(ROOT), *args], capture_output=True,
                              text=True, check=True, timeout=30).stdout.strip()
    try:
        head = git("rev-parse", "--short", "HEAD")
        return head + ("+dirty" if git("status", "--porcelain", "--untracked-files=no") else "")
    except (OSError, subprocess.SubprocessError):
        return None


def machine() -> dict[str, Any]:
    """Platform, CPU model and count, memory and torch's version and device."""
    return {"platform": platform.platform(), "cpu": cpu_model(), "cpus": os.cpu_count(),
            "memory_gb": memory_gb(), "torch": torch_info()}


def cpu_model() -> str:
    """The CPU's model name from /proc/cpuinfo, else what ``platform`` says."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def memory_gb() -> float | None:
    """Total memory in GiB, from /proc/meminfo; None where there is none."""
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                return round(int(line.split()[1]) / 2**20, 1)
    except (OSError, ValueError, IndexError):
        pass
    return None


def torch_info() -> dict[str, Any]:
    """torch's version and the device jobs ran on (``GPULANES_DEVICE``, resolved)."""
    try:
        import torch
    except ImportError:
        return {"version": None, "device": "cpu"}
    wanted = os.environ.get("GPULANES_DEVICE", "auto")
    cuda = wanted != "cpu" and torch.cuda.is_available()
    return {"version": torch.__version__,
            "device": torch.cuda.get_device_name(0) if cuda else "cpu"}


def version(package: str) -> str | None:
    """An installed package's version; None when it is not installed."""
    try:
        return metadata.version(package)
    except metadata.PackageNotFoundError:
        return None


def command() -> str:
    """The command line that ran, paths under the project written relative to it."""
    argv = list(getattr(sys, "orig_argv", sys.argv))
    argv[0] = "python"
    return shlex.join(relative(arg) for arg in argv)


def relative(arg: str) -> str:
    """``arg`` relative to the project root when it is a path inside it."""
    try:
        return str(Path(arg).resolve().relative_to(ROOT)) if os.sep in arg else arg
    except ValueError:
        return arg
