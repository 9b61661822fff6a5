"""The architecture as it runs: a producer loads none of the worker. (The import rules
themselves are import-linter contracts in setup.cfg, checked by ``make test``.)"""
from __future__ import annotations

import json
import subprocess
import sys

from tasks.settings import PROJECT_DIR

HEAVY = ("torch", "numpy", "PIL", "prometheus_client", "gpu_worker", "tasks.worker", "beat")


def test_a_producer_imports_no_worker_code():
    probe = ("import json, sys; from tasks import submit; "
             "print(json.dumps(sorted(sys.modules)))")
    proc = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                          cwd=PROJECT_DIR, check=True)
    loaded = json.loads(proc.stdout)
    heavy = [m for m in loaded if m in HEAVY or m.startswith(tuple(f"{h}." for h in HEAVY))]
    assert not heavy, f"`from tasks import submit` loaded {heavy[:10]}"
    assert "tasks.broker.enqueue" in loaded  # the probe did reach the publish path
