"""Warm models on a real worker: models load on first use, stay warm, LRU makes room
(a budget of 4 MB holds two demo models, 2 MB each)."""
from __future__ import annotations

import numpy as np
import pytest
from conftest import SMALL, vary
from PIL import Image

from routing.names import STATS_COMMAND
from tasks import submit

pytestmark = pytest.mark.cluster


@pytest.fixture(scope="module")
def cluster(cluster_factory):
    return cluster_factory(workers=1, env={"GPULANES_MODEL_MEMORY_MB": "4"})


@pytest.fixture(autouse=True)
def every_job_runs(monkeypatch):
    """Repeats of one seeded job must reach the worker: cold starts are what is measured."""
    vary(monkeypatch, cache=False)


def _run(model: str) -> dict:
    return submit("same prompt", model=model, seed=3, **SMALL).get(timeout=120)


def _warm(app) -> list[str]:
    (answer,) = app.control.broadcast(STATS_COMMAND, reply=True, timeout=1.0)
    (reply,) = answer.values()
    return reply["warm_models"]


def test_first_use_is_cold_then_warm_and_lru_makes_room(cluster, app):
    assert _warm(app) == ["demo"]  # GPULANES_WARM_MODELS, loaded before consuming
    first = _run("demo-0")
    assert first["cold_start"] and first["load_ms"] > 0
    again = _run("demo-0")
    assert not again["cold_start"] and again["load_ms"] == 0
    assert _warm(app) == ["demo", "demo-0"]
    assert not _run("demo")["cold_start"]      # demo is now the most recent
    assert _run("demo-1")["cold_start"]        # evicts demo-0, the least recent
    assert _warm(app) == ["demo", "demo-1"]
    assert _run("demo-0")["cold_start"]        # it had to come back
    assert _warm(app) == ["demo-1", "demo-0"]


def test_family_members_have_their_own_weights(cluster):
    a, b = (np.asarray(Image.open(_run(m)["image"])) for m in ("demo-1", "demo-2"))
    assert a.shape == b.shape and not np.array_equal(a, b)
