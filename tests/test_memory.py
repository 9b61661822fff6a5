"""Models held by memory on a real worker: declared sizes against the worker's budget,
least recently used out until a model fits; a model too big for every worker refused
at submit."""
from __future__ import annotations

import os

import pytest
from conftest import vary

from routing.names import LANES, STATS_COMMAND
from routing.policy import PolicyView
from tasks import submit
from tasks.broker.keys import lane_keys
from tasks.errors import ModelError
from tasks.jobs.fits import check_fits

SIZED = {f"small-{i}": "tests.sized_models:Small" for i in range(3)} | {
    "large": "tests.sized_models:Large", "huge": "tests.sized_models:Huge"}
MODELS = ",".join([os.environ["GPULANES_MODELS"], *(f"{n}={t}" for n, t in SIZED.items())])
SMALLS = ["small-0", "small-1", "small-2"]
ENV = {"GPULANES_MODELS": MODELS, "GPULANES_WARM_MODELS": "small-0",
       "GPULANES_MODEL_MEMORY_MB": "300"}


@pytest.fixture(autouse=True)
def sized_models(monkeypatch):
    vary(monkeypatch, models=MODELS, warm_models="small-0", model_memory_mb=300, cache=False)


def _stats(app) -> dict:
    (answer,) = app.control.broadcast(STATS_COMMAND, reply=True, timeout=1.0)
    (reply,) = answer.values()
    return reply


def _run(model: str, n: int = 0) -> dict:
    return submit(model=model, n=n).get(timeout=60)


@pytest.mark.cluster
def test_three_small_models_share_a_worker_that_one_large_fills(cluster_factory, app):
    cluster_factory(workers=1, env=ENV)
    stats = _stats(app)
    assert stats["memory_mb"] == 300 and stats["model_mb"] == {"small-0": 90}
    for i, model in enumerate(SMALLS):
        _run(model, i)
    stats = _stats(app)
    assert stats["warm_models"] == SMALLS  # 270 MB of 300: all three held
    assert stats["model_mb"] == dict.fromkeys(SMALLS, 90)
    _run("large")  # 250 MB: every small one goes to make room
    stats = _stats(app)
    assert stats["warm_models"] == ["large"] and stats["model_mb"] == {"large": 250}
    for i, model in enumerate(SMALLS):
        _run(model, i)
    assert _stats(app)["warm_models"] == SMALLS  # the first small one evicted the large


def _view(budgets: dict[str, int], sizes: dict[str, int] | None = None) -> PolicyView:
    return PolicyView(budget_mb=budgets, model_mb=sizes or {},
                      largest_budget_mb=max(budgets.values(), default=None))


def test_a_model_too_big_for_every_worker_is_refused_at_submit():
    with pytest.raises(ModelError) as caught:
        check_fits("huge", _view({"w0": 300, "w1": 8000}))
    said = str(caught.value)
    assert "'huge'" in said and "100000 MB" in said and "8000 MB" in said
    check_fits("large", _view({"w0": 300}))  # fits the largest
    # a model that declares nothing: its size as workers measured it
    with pytest.raises(ModelError, match="'demo' needs 500 MB"):
        check_fits("demo", _view({"w0": 300}, {"demo": 500}))
    check_fits("demo", _view({"w0": 300}))  # not measured yet: nothing to refuse
    # no live worker known: the CPU budget setting (300 MB here)
    with pytest.raises(ModelError, match="GPULANES_MODEL_MEMORY_MB"):
        check_fits("huge", None)
    check_fits("large", None)


def test_submit_refuses_a_model_too_big_before_anything_is_enqueued(clean_redis):
    with pytest.raises(ModelError, match="'huge' needs 100000 MB"):
        submit(model="huge", n=1)
    assert not any(clean_redis.llen(key) for lane in LANES for key in lane_keys(lane))
