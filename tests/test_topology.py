"""NUMA binding of GPU workers: parsing the host's topology and pinning a child."""
from __future__ import annotations

import os
import subprocess
import sys

import pytest

from gpu_worker.processes import spawn
from gpu_worker.topology import cpus_for, gpus, numa_cpus, parse_cpulist, sysfs_bus_id


def _sysfs(root, bus_id: str, node: int, cpulist: str):
    device = root / "bus" / "pci" / "devices" / bus_id
    device.mkdir(parents=True)
    (device / "numa_node").write_text(f"{node}\n")
    if node >= 0:
        cpus = root / "devices" / "system" / "node" / f"node{node}"
        cpus.mkdir(parents=True)
        (cpus / "cpulist").write_text(cpulist + "\n")


def test_parse_cpulist():
    assert parse_cpulist("0-3,8,10-11\n") == {0, 1, 2, 3, 8, 10, 11}
    assert parse_cpulist("") == set()


def test_bus_ids_from_nvidia_smi_match_sysfs_names():
    assert sysfs_bus_id("00000000:3B:00.0") == "0000:3b:00.0"


def test_numa_cpus_of_a_gpu(tmp_path):
    _sysfs(tmp_path, "0000:3b:00.0", 1, "16-31")
    _sysfs(tmp_path, "0000:af:00.0", -1, "")  # the host reports no node
    assert numa_cpus("00000000:3B:00.0", tmp_path) == set(range(16, 32))
    assert numa_cpus("00000000:AF:00.0", tmp_path) is None
    assert numa_cpus("00000000:01:00.0", tmp_path) is None  # no such device


def test_no_gpu_no_binding():
    if gpus():
        pytest.skip("this host has GPUs")
    assert cpus_for("0") is None


def test_spawned_worker_is_bound_to_its_cpus():
    cpu = min(os.sched_getaffinity(0))
    child = spawn([sys.executable, "-c", "import os; print(sorted(os.sched_getaffinity(0)))"],
                  cpus={cpu}, stdout=subprocess.PIPE, text=True)
    out, _ = child.communicate(timeout=30)
    assert out.strip() == f"[{cpu}]"
