"""GPU topology: which CPU cores sit on the same NUMA node as a GPU.

A worker bound to its GPU's NUMA node copies host memory (pinned buffers,
decoded inputs) over the near PCIe root instead of across the socket link.
Everything here degrades to "no binding" where the host does not report it
(no ``nvidia-smi``, a single-node machine, a container hiding ``/sys``).
"""
from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

SYS = Path("/sys")


def parse_cpulist(text: str) -> set[int]:
    """``"0-3,8,10-11"`` -> {0, 1, 2, 3, 8, 10, 11}."""
    cpus: set[int] = set()
    for part in text.strip().split(","):
        if part:
            low, _, high = part.partition("-")
            cpus.update(range(int(low), int(high or low) + 1))
    return cpus


def sysfs_bus_id(bus_id: str) -> str:
    """nvidia-smi's ``00000000:3B:00.0`` -> sysfs's ``0000:3b:00.0``."""
    domain, rest = bus_id.strip().split(":", 1)
    return f"{int(domain, 16):04x}:{rest.lower()}"


def gpus() -> dict[str, str]:
    """GPU index and UUID -> PCI bus id, from nvidia-smi ({} where there is none)."""
    if shutil.which("nvidia-smi") is None:
        return {}
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=index,uuid,pci.bus_id",
                              "--format=csv,noheader"], capture_output=True, text=True,
                             timeout=10, check=True).stdout
    except (OSError, subprocess.SubprocessError):
        return {}
    found = {}
    for line in out.splitlines():
        index, uuid, bus_id = (field.strip() for field in line.split(","))
        found[index] = found[uuid] = bus_id
    return found


def numa_cpus(bus_id: str, sys_root: Path = SYS) -> set[int] | None:
    """The CPUs of the NUMA node of the PCI device ``bus_id``, if the host says."""
    try:
        device = sys_root / "bus" / "pci" / "devices" / sysfs_bus_id(bus_id)
        node = int((device / "numa_node").read_text())
        if node < 0:
            return None
        cpulist = sys_root / "devices" / "system" / "node" / f"node{node}" / "cpulist"
        return parse_cpulist(cpulist.read_text()) or None
    except (OSError, ValueError):
        return None


def cpus_for(device_id: str, known: dict[str, str] | None = None) -> set[int] | None:
    """CPUs to bind the worker of GPU ``device_id`` (an index or UUID) to, or None."""
    bus_id = (gpus() if known is None else known).get(device_id)
    return numa_cpus(bus_id) if bus_id else None
