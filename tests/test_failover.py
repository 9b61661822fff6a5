"""Redis failover on real processes: a primary, two replicas and three Sentinels, two
workers and two beats behind the ``sentinel://`` URL, jobs streaming in while the
primary is SIGSTOPped past ``down-after-milliseconds`` and woken up. Every job is
counted (``benchmarks/failover.py``, run as it is documented, in a process of its own:
``tasks`` reads its broker URL once). The same harness runs the primary SIGKILLed, the
40 s freeze and the lagging replicas in ``make soak``."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

PROJECT_DIR = Path(__file__).resolve().parent.parent
DOWN_AFTER_S = 3.0  # the harness's default down-after-milliseconds

pytestmark = pytest.mark.cluster


def _failover(name: str, tmp_path: Path) -> dict:
    out = tmp_path / "failover.json"
    env = {k: v for k, v in os.environ.items() if not k.startswith("GPULANES_")}
    proc = subprocess.run([sys.executable, "benchmarks/failover.py", "--quick", "--only", name,
                           "--json", str(out), "--logs", str(tmp_path / "logs")],
                          cwd=PROJECT_DIR, env=env, capture_output=True, text=True, timeout=420)
    assert out.exists(), proc.stdout[-3000:] + proc.stderr[-3000:]
    report = json.loads(out.read_text())["runs"][0]
    report["output"] = proc.stdout[-4000:]
    report["returncode"] = proc.returncode
    return report


def _check(report: dict) -> None:
    said = report["output"]
    counts = report["counts"]
    assert counts["accepted"] > 20, said
    # every accepted job done, none lost, none failed, none run twice to the end
    assert counts["completed"] == counts["accepted"], said
    assert (counts["lost"], counts["failed"], counts["falsely_failed"],
            counts["duplicated"], report["ran_twice"]) == (0, 0, 0, 0, 0), said
    # one beat leads at the end, on an epoch above the one led before the fault
    beat = report["beat"]
    leading = [b for b, found in beat["at_end"].items()
               if (found["last"] or "").startswith("leads")]
    assert len(leading) == 1, said
    before = beat["before"][1]
    assert beat["on_new"] and all(epoch > before for _, b, epoch in beat["on_new"]
                                  if b != "-"), said
    # every process (submitter, workers, beats, exporter) is on the new primary within
    # 3 s of the promotion (down-after and the Sentinels' vote before it), and every
    # `lanes status` begun a second after the promotion answered
    promoted = report["timeline"]["promoted_s"]
    assert promoted is not None and promoted < DOWN_AFTER_S + 3, said
    bound = promoted + 3
    assert report["timeline"]["status_ok_s"] is not None, said
    assert report["timeline"]["status_failed_after_promotion"] == 0, said
    for name, found in report["clients"].items():
        assert found["on_new_s"] is not None and found["on_new_s"] <= bound, (name, said)
    assert report["timeline"]["submits_back_s"] <= bound, said
    assert report["returncode"] == 0, said


def test_a_primary_frozen_past_down_after_that_wakes_up_changes_nothing(tmp_path):
    report = _failover("freeze", tmp_path)
    _check(report)
    # the old primary woke up a primary and was demoted later; meanwhile it confirmed
    # nothing: no beat led there by its own account, no job ran from its stale lanes
    assert report["timeline"]["old_demoted_s"] is not None, report["output"]
