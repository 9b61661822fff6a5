"""Prewarm and minimum replicas on real workers; placement as a pure function."""
from __future__ import annotations

import os
import subprocess
import sys

import pytest
from conftest import SMALL, wait_until

from routing.names import STATS_COMMAND
from routing.placement import holders, prewarm_targets
from tasks import submit

WORKERS = {
    "a": {"alive": True, "warm_models": ["demo", "m"], "in_flight": {"fast": 1}},
    "b": {"alive": True, "warm_models": ["demo"], "in_flight": {}},
    "c": {"alive": True, "warm_models": [], "loading_models": ["m"], "in_flight": {}},
    "d": {"alive": False, "warm_models": ["m"], "in_flight": {}},
    "e": {"alive": True, "warm_models": [], "in_flight": {"relaxed": 2}},
}


def test_placement_counts_warm_and_loading_and_picks_the_least_busy():
    assert holders(WORKERS, "m") == ["a", "c"]  # d is dead
    assert prewarm_targets(WORKERS, "m", 2) == []
    assert prewarm_targets(WORKERS, "m", 3) == ["b"]  # idle beats busy e
    assert prewarm_targets(WORKERS, "m", 4) == ["b", "e"]
    assert prewarm_targets(WORKERS, "new", 1) == ["c"]  # idle, fewest warm models


@pytest.fixture(scope="module")
def cluster(cluster_factory):
    return cluster_factory(workers=2, beat=True, env={"GPULANES_MIN_REPLICAS": "demo-2=1"})


def _warm_on(app, model: str) -> list[str]:
    answers = app.control.broadcast(STATS_COMMAND, reply=True, timeout=1.0) or []
    return sorted(host for answer in answers for host, reply in answer.items()
                  if model in reply["warm_models"])


@pytest.mark.cluster
def test_prewarm_command_warms_replicas_before_traffic(cluster, app):
    proc = subprocess.run([sys.executable, "-m", "celery", "-A", "tasks", "lanes", "prewarm",
                           "demo-1", "--replicas", "2", "--wait", "60"],
                          env=os.environ, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "demo-1 warm on 2 workers" in proc.stdout
    assert _warm_on(app, "demo-1") == sorted(cluster.hostnames)
    assert not submit("after prewarm", model="demo-1", **SMALL).get(timeout=60)["cold_start"]


@pytest.mark.cluster
def test_beat_keeps_the_minimum_of_warm_replicas(cluster, app):
    wait_until(lambda: _warm_on(app, "demo-2"), timeout_s=30, what="beat to prewarm demo-2")


def test_prewarm_refuses_an_unknown_model(redis_server):
    proc = subprocess.run([sys.executable, "-m", "celery", "-A", "tasks", "lanes", "prewarm",
                           "no-such-model"], env=os.environ, capture_output=True, text=True,
                          timeout=60)
    assert proc.returncode != 0 and "model: unknown model" in proc.stderr
