"""``benchmarks/protocols.py --quick`` runs every queue protocol to the end (gpulanes'
transport among them), and the atomic hand-overs leave no job in no lane and under no
holder after a SIGKILL."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

PROJECT_DIR = Path(__file__).resolve().parent.parent


def test_quick_run_completes_every_protocol(tmp_path: Path) -> None:
    out = tmp_path / "protocols.json"
    command = [sys.executable, "benchmarks/protocols.py", "--quick", "--json", str(out)]
    proc = subprocess.run(command, cwd=PROJECT_DIR, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    report = json.loads(out.read_text())
    rows = {row["protocol"][0]: row for row in report["summary"]}
    assert sorted(rows) == ["a", "b", "c", "g", "k"]
    for row in rows.values():
        assert row["acked"] == report["config"]["jobs"], row
        assert row["jobs_per_s"] > 0 and row["commands_per_job"] > 0
        assert row["take_to_ack_p50_ms"] is not None and row["fast_wait_ms"] >= 0
        assert 0 < row["idle_pickup_p50_ms"] <= row["idle_pickup_p99_ms"] < 1000, row
        assert row["idle_cpu_pct"] >= 0 and row["idle_redis_cmds_per_s"] >= 0
        assert row["crash"]["kills"] == report["config"]["kills"]
    for key in "abcg":
        assert rows[key]["crash"]["orphans"] == 0, rows[key]
        assert rows[key]["crash"]["lost_after_recovery"] == 0, rows[key]
    assert "| a: Lua + ack set |" in proc.stdout and "| g: gpulanes (hand-over) |" in proc.stdout
