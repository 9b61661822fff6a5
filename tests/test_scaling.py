"""The scaling signal: the workers a pool needs (``routing.scaling``), its hysteresis,
beat's plan per pool (``beat.scaling``), and what operators and KEDA read of it."""
from __future__ import annotations

import json
import math
import random
from pathlib import Path

import pytest
import yaml

from beat.scaling import DEFAULT_POOL, plan, pools_of, shares
from routing.scaling import (UNBUDGETED_S, LaneDemand, Rate, Scale, needed, next_scale,
                             servers_for)
from tasks.ops.status import render_status

ROOT = Path(__file__).resolve().parent.parent


def late_share(arrivals_s: float, service_s: float, servers: int, budget_s: float) -> float:
    """P(wait > budget) of an M/M/c queue, from Erlang C's closed form."""
    load = arrivals_s * service_s
    if servers <= load:
        return 1.0
    top = load ** servers / math.factorial(servers) * servers / (servers - load)
    waiting = top / (sum(load ** k / math.factorial(k) for k in range(servers)) + top)
    return waiting * math.exp(-(servers - load) * budget_s / service_s)


@pytest.mark.parametrize("arrivals_s,service_s,budget_s,within", [
    (2.0, 5.0, 10.0, 0.999), (2.0, 5.0, 60.0, 0.95), (0.1, 5.0, 1.0, 0.999),
    (30.0, 1.0, 0.5, 0.99), (5.0, 8.0, 0.0, 0.9)])
def test_servers_for_is_the_fewest_that_meet_the_share(arrivals_s, service_s, budget_s,
                                                       within):
    servers = servers_for(arrivals_s, service_s, budget_s, within)
    assert late_share(arrivals_s, service_s, servers, budget_s) <= 1 - within + 1e-12
    assert late_share(arrivals_s, service_s, servers - 1, budget_s) > 1 - within


def test_no_arrivals_need_no_server():
    assert servers_for(0.0, 5.0, 10.0, 0.999) == 0
    assert needed([LaneDemand(0, 5, 0, 10), LaneDemand(0, 5, 0, 60), LaneDemand(0, 5)]) == 0


def test_a_lane_competes_with_the_lanes_above_it():
    fast = LaneDemand(2.0, 5.0, 0.0, 10.0, 0.999)
    standard = LaneDemand(2.0, 5.0, 0.0, 60.0, 0.95)
    assert needed([fast]) == servers_for(2.0, 5.0, 10.0, 0.999)
    assert needed([fast, standard]) >= servers_for(4.0, 5.0, 60.0, 0.95)
    relaxed = LaneDemand(10.0, 5.0, 6000.0)  # no budget: held to UNBUDGETED_S
    assert needed([fast, standard, relaxed]) == pytest.approx(
        servers_for(14.0, 5.0, UNBUDGETED_S, 0.95) + 6000 / UNBUDGETED_S)


def test_queued_work_asks_for_more_workers():
    idle = needed([LaneDemand(1.0, 5.0, 0.0, 10.0, 0.999)])
    assert needed([LaneDemand(1.0, 5.0, 200.0, 10.0, 0.999)]) == pytest.approx(idle + 20)


def test_wanted_goes_up_at_once_and_down_only_after_the_window():
    state = next_scale(Scale(), 9.5, 9.5, now=0.0, down_after_s=300)
    assert state.wanted == 10  # 9.5, rounded up
    for now in range(1, 300):
        state = next_scale(state, 4.0, 4.0, now=float(now), down_after_s=300)
        assert state.wanted == 10
    state = next_scale(state, 5.0, 5.0, now=301.0, down_after_s=300)
    assert state.wanted == 5  # the most needed over the window
    assert next_scale(state, 30.0, 30.0, now=302.0, down_after_s=300).wanted == 30


def test_a_need_back_up_restarts_the_window():
    state = next_scale(Scale(), 10.0, 10.0, now=0.0, down_after_s=300)
    state = next_scale(state, 4.0, 4.0, now=1.0, down_after_s=300)
    state = next_scale(state, 10.0, 10.0, now=200.0, down_after_s=300)  # back: the window ends
    state = next_scale(state, 4.0, 4.0, now=250.0, down_after_s=300)
    assert next_scale(state, 4.0, 4.0, now=400.0, down_after_s=300).wanted == 10
    assert next_scale(state, 4.0, 4.0, now=551.0, down_after_s=300).wanted == 4


def test_a_need_older_than_the_window_is_forgotten():
    """The step down goes to the most needed over the last window, not since the need
    first fell: a high need early in a long low spell does not hold ``wanted`` up."""
    state = next_scale(Scale(), 50.0, 50.0, now=0.0, down_after_s=300)
    assert state.wanted == 50
    state = next_scale(state, 48.0, 48.0, now=1.0, down_after_s=300)  # too small a step
    for now in range(2, 303):
        state = next_scale(state, 20.0, 20.0, now=float(now), down_after_s=300)
    assert state.wanted == 20


def test_wanted_stays_within_its_bounds():
    assert next_scale(Scale(), 0.0, 0.0, 0.0, 300, least=2).wanted == 2
    assert next_scale(Scale(), 500.0, 500.0, 0.0, 300, most=64).wanted == 64


@pytest.mark.parametrize("arrivals_s", [0.5, 4.0, 40.0])
def test_a_constant_load_settles_and_then_changes_wanted_at_most_once(arrivals_s):
    """Poisson arrivals at a constant rate, measured every second through the rate's
    averages, for three simulated hours: past the first ten minutes, ``wanted``
    changes at most once."""
    draw, rate, state, changes = random.Random(7), Rate(), Scale(), []
    for now in range(3 * 3600):
        count = _poisson(draw, arrivals_s)
        rate = rate.observed(count, 1.0)
        wanted = state.wanted
        state = next_scale(state, needed(_mix(rate.ahead(90.0))), needed(_mix(rate.level())),
                           float(now), 300.0)
        if state.wanted != wanted and now >= 600:
            changes.append((now, wanted, state.wanted))
    assert len(changes) <= 1, changes
    assert state.wanted >= arrivals_s * 5.0  # it serves the load


def _mix(arrivals_s: float) -> list[LaneDemand]:
    """A fifth of the jobs fast, half standard, the rest relaxed; 5 s each."""
    return [LaneDemand(arrivals_s * 0.2, 5.0, 0.0, 10.0, 0.999),
            LaneDemand(arrivals_s * 0.5, 5.0, 0.0, 60.0, 0.95), LaneDemand(arrivals_s * 0.3, 5.0)]


def _poisson(draw: random.Random, mean: float) -> int:
    count, total = 0, draw.expovariate(1.0)
    while total < mean:
        count, total = count + 1, total + draw.expovariate(1.0)
    return count


def test_the_rate_foresees_a_ramp():
    """A rate rising 0.1 jobs/s every second: the forecast a minute ahead is within a
    tenth of what the rate is then; a falling one is not foreseen below its average."""
    rate = Rate()
    for now in range(600):
        rate = rate.observed(20.0 + 0.1 * now, 1.0)
    assert rate.ahead(60.0) == pytest.approx(20.0 + 0.1 * 660, rel=0.1)
    assert rate.ahead(60.0) > rate.quick  # beyond where the average is now
    falling = Rate()
    for now in range(600):
        falling = falling.observed(100.0 - 0.1 * now, 1.0)
    assert falling.ahead(60.0) < falling.quick < falling.level()


def _worker(pool: str, models: list[str], busy: float = 0.0, alive: bool = True) -> dict:
    return {"pool": pool, "alive": alive, "warm_models": models, "concurrency": 1,
            "busy": {"standard": busy}, "service_ms": {"standard": 5000.0},
            "load_ms": {m: 2000.0 for m in models}}


def test_queued_jobs_go_to_the_pools_that_hold_their_models():
    pools = {"default": set(), "image": {"sdxl"}, "text": {"llm"}, "both": {"llm"}}
    sample = [("sdxl", 1.0, 3.0), ("llm", 1.0, 2.0), ("unheard", 1.0, 5.0)]
    found = shares(pools, sample)
    assert found == {"default": 0.5, "image": 0.3, "text": 0.1, "both": 0.1}
    assert shares(pools, []) == {"default": 1.0, "image": 0.0, "text": 0.0, "both": 0.0}


def test_beat_plans_each_pool_and_remembers_one_scaled_to_zero():
    workers = {"a": _worker("image", ["sdxl"], busy=1.0), "b": _worker("image", ["sdxl"]),
               "c": _worker(DEFAULT_POOL, ["demo"])}
    loads = {"standard": {"depth": 40, "service_s": 5.0, "queued_job_s": 5.0}}
    sample = {"standard": [("sdxl", 1.0, 40.0)]}
    first = plan({}, workers, loads, sample, {"fast": 10.0, "standard": 60.0}, now=100.0)
    assert set(first) == {"image", DEFAULT_POOL}
    image = first["image"]
    assert image["current"] == 2 and image["queued"]["standard"] == 40
    assert image["need"] >= round(40 * 5.0 / 60, 3)  # its queue drained within the budget
    assert image["wanted"] >= image["need"] and image["warm_s"] == 62.0
    assert first[DEFAULT_POOL]["queued"]["standard"] == 0
    # the pool's workers gone: it keeps its models, and its queue still wants workers
    later = plan(first, {"c": workers["c"]}, loads, sample, {"standard": 60.0}, now=101.0)
    assert later["image"]["current"] == 0 and later["image"]["wanted"] >= 1
    assert pools_of({}, later)["image"] == {"sdxl"}
    # the growth of its queue counts as arrivals
    grown = plan(later, {"c": workers["c"]}, {"standard": {**loads["standard"], "depth": 60}},
                 sample, {"standard": 60.0}, now=111.0)
    assert grown["image"]["rates"]["standard"][0] > 0


def test_status_shows_the_pools():
    shown = render_status({"at": 0, "lanes": {}, "workers": {}, "pools": {
        "image": {"current": 3, "wanted": 5, "need": 4.6, "warm_s": 62.0,
                  "models": ["sdxl"]}}})
    row = next(line for line in shown.splitlines() if line.lstrip().startswith("image"))
    assert row.split()[:4] == ["image", "3", "5", "4.60"] and "sdxl" in row


def test_the_exporter_serves_the_pools_to_keda_and_prometheus(clean_redis):
    redis_client = clean_redis
    from prometheus_client import generate_latest
    from prometheus_client.registry import CollectorRegistry

    from beat.scaling import write
    from tasks.ops.metrics import LanesCollector, scaling_app

    write(redis_client, {"image": {"wanted": 5, "current": 3, "need": 4.6, "models": ["x"]}},
          now=12.0)
    answered = {}
    body = b"".join(scaling_app(redis_client, None)(
        {"PATH_INFO": "/scaling"}, lambda status, headers: answered.update(status=status)))
    assert answered["status"] == "200 OK"
    assert json.loads(body) == {"at": 12.0, "pools": {
        "image": {"wanted": 5, "current": 3, "need": 4.6}}}
    registry = CollectorRegistry()
    registry.register(LanesCollector(redis_client))
    text = generate_latest(registry).decode()
    assert 'gpulanes_pool_workers_wanted{pool="image"} 5.0' in text
    assert 'gpulanes_pool_workers_current{pool="image"} 3.0' in text


def _documents(name: str) -> list[dict]:
    return [doc for doc in yaml.safe_load_all((ROOT / "docker/kubernetes" / name).read_text())
            if doc]


def test_the_kubernetes_example_gives_keda_what_it_requires():
    """Each ScaledObject targets a worker Deployment of the example, through a
    metrics-api trigger on the exporter's /scaling with the fields KEDA requires, and a
    TriggerAuthentication of the example for its login."""
    workers = {d["metadata"]["name"]: d for d in _documents("workers.yaml")
               if d["kind"] == "Deployment"}
    scaled = _documents("scaledobject.yaml")
    auths = {d["metadata"]["name"]: d for d in scaled if d["kind"] == "TriggerAuthentication"}
    objects = [d for d in scaled if d["kind"] == "ScaledObject"]
    assert objects
    for found in objects:
        assert found["apiVersion"] == "keda.sh/v1alpha1"
        target = workers[found["spec"]["scaleTargetRef"]["name"]]
        env = {e["name"]: e.get("value") for e in
               target["spec"]["template"]["spec"]["containers"][0]["env"]}
        trigger, = found["spec"]["triggers"]
        meta = trigger["metadata"]
        assert trigger["type"] == "metrics-api"
        assert {"url", "valueLocation", "targetValue"} <= set(meta)
        assert meta["url"].endswith(":9808/scaling")
        assert meta["valueLocation"] == f"pools.{env['GPULANES_POOL']}.wanted"
        assert float(meta["targetValue"]) == 1.0
        auth = auths[trigger["authenticationRef"]["name"]]
        assert meta["authMode"] == "basic"
        assert {p["parameter"] for p in auth["spec"]["secretTargetRef"]} == \
            {"username", "password"}
        assert found["spec"]["minReplicaCount"] <= found["spec"]["maxReplicaCount"]
