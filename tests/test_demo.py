"""Smoke run of ``make demo``'s program: its own embedded Redis, all three lanes."""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
from PIL import Image

pytestmark = pytest.mark.cluster


def test_demo_runs_all_lanes_and_writes_pngs():
    state = Path(tempfile.mkdtemp(prefix="gl-demo-", dir="/tmp"))
    env = {k: v for k, v in os.environ.items() if not k.startswith("GPULANES_")}
    env.update(GPULANES_STATE_DIR=str(state), GPULANES_ARTIFACT_DIR=str(state / "png"),
               GPULANES_DEVICE="cpu")
    args = ["--fast", "2", "--standard", "3", "--relaxed", "4", "--echo", "3", "--faces", "1",
            "--steps", "4", "--size", "64"]
    try:
        proc = subprocess.run([sys.executable, "-m", "tasks.dev.demo", *args], env=env,
                              capture_output=True, text=True, timeout=150)
        _check(proc, state)
    finally:
        shutil.rmtree(state, ignore_errors=True)


def _check(proc: subprocess.CompletedProcess, state: Path) -> None:
    assert proc.returncode == 0, proc.stdout + proc.stderr
    rows = {line.split()[0]: line.split() for line in proc.stdout.splitlines()
            if line.split() and line.split()[0] in ("fast", "standard", "relaxed")}
    assert [rows[t][1] for t in ("fast", "standard", "relaxed")] == ["4", "4", "5"]
    assert "13/13 done, 0 failed" in proc.stdout
    assert "echo         3 jobs, e.g. {'text': 'echo 0 echo 0 '}" in proc.stdout
    pngs = list((state / "png").glob("*.png"))
    assert len(pngs) == 10 and all(Image.open(p).format == "PNG" for p in pngs)
    grid = proc.stdout.split("faces, a grid of 4 per job:\n  seed 1   ", 1)[1].split()[0]
    assert Image.open(grid).size == (4 * 130 + 2, 132)  # 4 faces, 64 px upscaled 2x
    assert (state / "appendonly.aof").exists()  # the embedded Redis ran with AOF on
    assert not (state / "redis.sock").exists()  # ...and was shut down
