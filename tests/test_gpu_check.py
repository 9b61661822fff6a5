"""The prepared GPU check (``benchmarks/gpu.py``) in its small CPU form, run as it is
documented: every section runs, says where it ran and holds sane figures, so the
check cannot rot while no GPU is at hand."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.cluster
ROOT = Path(__file__).resolve().parent.parent
SECTIONS = {"shards", "pinning", "cold_warm", "preemption", "oom", "batching"}


@pytest.fixture(scope="module")
def found(tmp_path_factory) -> dict:
    out = tmp_path_factory.mktemp("gpu") / "gpu.json"
    proc = subprocess.run([sys.executable, "benchmarks/gpu.py", "--device", "cpu", "--tiny",
                           "--json", str(out)], cwd=ROOT, capture_output=True, text=True,
                          timeout=170)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return json.loads(out.read_text())


def test_every_section_ran_on_the_cpu_and_did_what_it_must(found):
    assert found["device"] == "cpu" and found["tiny"] is True
    assert set(found["sections"]) == SECTIONS
    assert found["ran_on"] == {name: "cpu" for name in SECTIONS}
    for name, section in found["sections"].items():
        assert section["ok"] is True and section["device"] == "cpu", name
        assert 0 <= section["seconds"] < 120, name
    assert found["host"]["gpus"] == 0 and found["host"]["gpu"] is None


def test_shards_pinning_and_cold_start_figures(found):
    shards, pinning = found["sections"]["shards"], found["sections"]["pinning"]
    assert shards["shards"] == 7 and shards["equal_to_cpu_load"] is True
    assert shards["serial_ms"] > 0 and shards["parallel_ms"] > 0
    assert pinning["workers"] == 1 and pinning["job_devices"] == ["cpu"]
    assert pinning["worker_env"]["GPULANES_WORKER_DEVICE"] == "cpu"
    cold_warm = found["sections"]["cold_warm"]
    assert cold_warm["cold"]["cold_start"] is True and cold_warm["cold"]["load_ms"] > 0
    assert cold_warm["warm"]["cold_start"] is False and cold_warm["warm"]["load_ms"] == 0


def test_preemption_out_of_memory_and_batching_figures(found):
    preemption = found["sections"]["preemption"]
    assert preemption["relaxed_preempted"] >= 1
    assert 0 < preemption["fast_wait_ms"] < preemption["relaxed_run_ms"]
    oom = found["sections"]["oom"]
    assert oom["how"].startswith("simulated")
    assert oom["single"]["too_big"]["state"] == "FAILURE"
    assert oom["single"]["too_big"]["runs"] == 2  # one try and its one retry
    assert "OutOfMemoryError" in oom["single"]["too_big"]["error"]
    assert oom["batch"]["batch_sizes"] == [2, 2, 2, 2]
    batching = found["sections"]["batching"]
    assert batching["single"]["mean_batch"] == 1 and batching["batched"]["mean_batch"] > 1
    for run in (batching["single"], batching["batched"]):
        assert run["jobs"] == 16 and run["jobs_per_s"] > 0
    assert batching["speedup"] > 0
