"""A job's cost (its model's ``cost(inputs)``) in the expected-wait estimate: carried by
its message, priced by the line in cost each worker fits per model, read by beat from
a bounded sample of each lane's lists."""
from __future__ import annotations

import pytest
from pydantic import BaseModel

from beat.costs import SAMPLE_PER_LANE, queued_sample, sample_plan
from beat.heartbeat import lane_depths, list_lengths
from beat.snapshot import lane_loads
from conftest import SMALL, vary
from tasks.broker.keys import LIST_DEPTHS_KEY
from tasks.broker.message import Job
from tasks.errors import ModelError
from tasks.settings import settings


class SizedInput(BaseModel):
    size: str = "1"


#: What ``Sized.cost`` returns for a size that is not a number.
BAD_COSTS = {"nan": float("nan"), "negative": -1.0, "zero": 0, "word": "heavy", "true": True}


class Sized:
    """Its cost is what the job says it is: the tests give bad ones too."""

    Input = SizedInput

    def predict(self, inputs: SizedInput, progress: object) -> dict:
        return {}

    @staticmethod
    def cost(inputs: SizedInput) -> object:
        return BAD_COSTS[inputs.size] if inputs.size in BAD_COSTS else float(inputs.size)


@pytest.fixture
def sized(monkeypatch):
    vary(monkeypatch, models={**settings.models, "sized": "tests.test_costs:Sized"})


def test_an_image_jobs_cost_is_its_steps_times_pixels_over_the_defaults():
    from tasks.jobs.schema import check_job, validate

    assert validate("a fox").cost == 1.0
    assert "cost" not in validate("a fox").encode()  # the default leaves the message as it was
    job = validate("a fox", steps=40, width=512, height=256)
    assert job.cost == 4.0 and Job.decode(job.encode()).cost == 4.0
    assert check_job(job.encode()).cost == 4.0  # the worker works it out again


def test_a_class_models_cost_travels_with_its_job_and_a_bad_one_names_the_model(sized):
    from tasks.jobs.schema import validate

    assert validate(model="sized", size="2.5").cost == 2.5
    assert validate(model="echo", text="hi").cost == 1.0  # declares none
    for bad in BAD_COSTS:
        with pytest.raises(ModelError, match="'sized'.*cost\\(inputs\\) returned"):
            validate(model="sized", size=bad)


def test_the_adapters_costs_are_called_on_the_class():
    from tasks.models.diffusion import Diffusion, DiffusionInput
    from tasks.models.text import EmbeddingInput, TextEmbedding

    big = Diffusion.cost(DiffusionInput(prompt="a", steps=50, width=1024, height=1024))
    small = Diffusion.cost(DiffusionInput(prompt="a", steps=20, width=256, height=256))
    assert big / small == pytest.approx(2.5 * 16)
    assert TextEmbedding.cost(EmbeddingInput(texts=["x"] * 17)) == pytest.approx(2.017)


def test_the_sample_uses_its_whole_budget_shared_among_the_lists():
    assert sample_plan({"a": 0, "b": 0}) == {}
    assert sample_plan({"a": 5, "b": 100, "c": 0}) == {"a": 5, "b": SAMPLE_PER_LANE - 5}
    assert sample_plan({"a": 100, "b": 1}) == {"b": 1, "a": SAMPLE_PER_LANE - 1}
    assert sample_plan({"a": 30, "b": 40}) == {"a": 24, "b": 24}
    plan = sample_plan({f"q{i}": 3 + i for i in range(100)})  # more lists than the budget
    assert sum(plan.values()) == SAMPLE_PER_LANE and set(plan.values()) == {1}
    assert min(int(key[1:]) for key in plan) == 100 - SAMPLE_PER_LANE  # the longest
    assert sample_plan({"a": 1000}) == {"a": SAMPLE_PER_LANE}
    assert sample_plan({"a": 3}) == {"a": 3}


WORKER = {"alive": True, "concurrency": 1, "service_ms": {"standard": 1000.0},
          "cost_ms": {"demo": [0.0, 1000.0]}}


def test_queued_jobs_are_priced_by_their_cost_and_their_models_unit():
    depths = {"fast": 0, "standard": 10, "relaxed": 0}
    light = lane_loads({"w": WORKER}, depths, 1.0, {"standard": [("demo", 1.0, 1.0)] * 10})
    heavy = lane_loads({"w": WORKER}, depths, 1.0, {"standard": [("demo", 4.0, 1.0)] * 10})
    assert light["standard"]["expected_wait_s"] == pytest.approx(10.0)
    assert heavy["standard"]["expected_wait_s"] == pytest.approx(40.0)
    assert heavy["standard"]["queued_job_s"] == 4.0 and heavy["standard"]["service_s"] == 1.0
    based = {"w": {**WORKER, "cost_ms": {"demo": [500.0, 1000.0]}}}  # 0.5 s a job besides
    assert lane_loads(based, depths, 1.0, {"standard": [("demo", 4.0, 1.0)] * 10})[
        "standard"]["expected_wait_s"] == pytest.approx(45.0)
    # a model no worker measured yet is priced at the lane's service time
    other = lane_loads({"w": WORKER}, depths, 1.0, {"standard": [("demo-3", 9.0, 1.0)] * 10})
    assert other["standard"]["expected_wait_s"] == pytest.approx(10.0)
    assert lane_loads({"w": WORKER}, depths, 1.0)["standard"]["expected_wait_s"] == 10.0
    # a long list of big jobs beside short lists of small ones: each sampled job weighs
    # as many jobs as it stands for (here 1 big for 99, 1 small for 1)
    mixed = [("demo", 4.0, 99.0), ("demo", 0.5, 1.0)]
    assert lane_loads({"w": WORKER}, {"standard": 100}, 1.0, {"standard": mixed})[
        "standard"]["queued_job_s"] == pytest.approx((99 * 4.0 + 0.5) / 100, abs=1e-4)
    broken = {"w": {**WORKER, "cost_ms": {"demo": "nonsense", "demo-1": [1.0]}}}
    assert lane_loads(broken, depths, 1.0, {"standard": [("demo", 4.0, 1.0)] * 10})[
        "standard"]["expected_wait_s"] == pytest.approx(10.0)  # priced at the service


def test_beat_reads_the_costs_of_queued_jobs_from_redis(app, clean_redis):
    """Jobs in Redis, no worker: what beat's sample of the lanes finds."""
    from tasks import submit

    for seed in range(5):  # seeds differ: identical jobs would share one run
        submit("small", seed=seed, **SMALL)
    for seed in range(3):
        submit("big", seed=seed, steps=40, width=512, height=256)
    lengths = list_lengths(clean_redis)
    assert lane_depths(clean_redis, lengths=lengths)["standard"] == 8
    sample = queued_sample(clean_redis, lengths)
    small = 4 * 64 * 64 / (20 * 256 * 256)
    assert sorted(sample["standard"]) == [("demo", small, 1.0)] * 5 + [("demo", 4.0, 1.0)] * 3
    assert sample["fast"] == sample["relaxed"] == []
    loads = lane_loads({"w": WORKER}, {"standard": 8}, 1.0, sample)
    assert loads["standard"]["expected_wait_s"] == pytest.approx(5 * small + 3 * 4.0, abs=1e-3)


def test_a_per_job_overhead_is_told_apart_from_the_cost_once_costs_differ():
    from gpu_worker.costfit import CostFit

    fit = CostFit()
    for _ in range(5):
        fit.add(0.5, 60.0)
    assert fit.line() == pytest.approx((0.0, 120.0))  # one cost seen: through the origin
    for i in range(40):  # 10 ms a job, 100 ms a unit of cost
        cost = (0.5, 1.0, 4.0)[i % 3]
        fit.add(cost, 10.0 + 100.0 * cost)
    base, unit = fit.line()
    assert base == pytest.approx(10.0, rel=0.05) and unit == pytest.approx(100.0, rel=0.01)
    flat = CostFit()
    for i in range(30):  # cost makes no difference (noise): the mean, whatever the cost
        flat.add((1.0, 2.0)[i % 2], (21.0, 19.0)[i % 2])
    assert flat.line()[1] == 0.0 and flat.line()[0] == pytest.approx(20.0, abs=0.5)


def test_a_worker_reports_each_models_line_beside_each_lanes_service_time():
    from gpu_worker.runtime import Runtime

    runtime = Runtime()
    for lane, ms, model, cost in (("standard", 400.0, "demo", 4.0), ("fast", 50.0, "echo", 1.0),
                                  ("standard", 0.0, "demo", 1.0)):
        runtime.job_started(lane)
        runtime.job_finished(lane, ms or None, model, cost)  # 0: the job failed
    stats = runtime.stats()
    assert stats["cost_ms"] == {"demo": [0.0, 100.0], "echo": [0.0, 50.0]}
    assert stats["service_ms"] == {"standard": 400.0, "fast": 50.0} and stats["failed"] == 1


def test_malformed_lane_items_are_priced_as_unknown_jobs(clean_redis):
    """Anything in a lane list that is no job message (a huge integer cost, JSON too
    deep to parse, garbage) is an unknown job in the sample, never a failed round."""
    deep = "[" * 100_000 + "]" * 100_000
    for item in ('{"body": "x"}', "not json", deep, _message({"model": "demo",
                                                              "cost": 10**400})):
        clean_redis.lpush("standard", item)
    clean_redis.hset(LIST_DEPTHS_KEY, "standard", 4)  # as if published: counted
    sample = queued_sample(clean_redis, list_lengths(clean_redis))
    assert sorted(sample["standard"]) == [("", 1.0, 1.0)] * 3 + [("demo", 1.0, 1.0)]


def _message(job: dict) -> str:
    import base64
    import json

    body = base64.b64encode(json.dumps([[], {"job": job}, {}]).encode()).decode()
    return json.dumps({"body": body, "headers": {}, "properties": {"delivery_tag": "t"}})


def test_a_cost_hook_must_be_callable_on_the_class(sized, monkeypatch):
    from tasks.jobs import catalog, schema

    class Bound(Sized):
        def cost(self, inputs):  # needs an instance: the submitting process has none
            return 1.0

    class Raising(Sized):
        @staticmethod
        def cost(inputs):
            raise ZeroDivisionError("oops")

    monkeypatch.setattr(catalog, "_resolve", lambda name, target: catalog.ModelSpec(
        name, target, {"bound": Bound, "raising": Raising}.get(name, Sized)))
    with pytest.raises(ModelError, match="staticmethod or @classmethod"):
        catalog._check_class("bound", "x:Bound", Bound)
    vary(monkeypatch, models={**settings.models, "raising": "x:Raising"})
    with pytest.raises(ModelError, match="cost\\(inputs\\) raised ZeroDivisionError"):
        schema.validate(model="raising")
    assert schema.validate(model="sized", size="0.0000001").cost == 1e-07  # never 0


SEEN_LOADING: list = []


def _loading_factory(name, device, model_dir):
    """A model whose load looks at what its worker reports meanwhile."""
    from gpu_worker.runtime import RUNTIME_UNDER_TEST
    SEEN_LOADING.append(RUNTIME_UNDER_TEST[0].stats()["loading_models"])
    return object()


def test_a_worker_reports_a_model_it_loads_for_a_job_as_loading(tmp_path, monkeypatch):
    """A load is not preempted: the router counts it as work a fast job waits for."""
    import gpu_worker.runtime as runtime_module
    from gpu_worker.runtime import Runtime

    runtime = Runtime()
    monkeypatch.setattr(runtime_module, "RUNTIME_UNDER_TEST", [runtime], raising=False)
    runtime.configure("w", "cpu", {"m": "test_costs:_loading_factory"}, tmp_path, 2)
    runtime.model("m")
    assert SEEN_LOADING == [["m"]]  # while it loaded
    assert runtime.stats()["loading_models"] == [] and runtime.stats()["warm_models"] == ["m"]
