"""The scaling signal: the workers a pool needs (``routing.scaling``), its hysteresis,
beat's plan per pool (``beat.scaling``), and what operators and KEDA read of it."""
from __future__ import annotations

import json
import math
import random
from pathlib import Path

import pytest
import yaml

from beat.scaling import DEFAULT_POOL, WITHIN, plan, pools_of, shares
from routing.names import LANES
from routing.scaling import (NOISE_Z, PLANNED_WAIT_S, UNBUDGETED_S, LaneDemand, LaneMeasure,
                             Rate, Scale, down_step, needed, next_scale, planned,
                             scale_round, servers_for)
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


@pytest.mark.parametrize("arrivals_s,service_s,budget_s,within", [
    (2.0, 5.0, 10.0, 0.999), (30.0, 6.0, 60.0, 0.95), (0.1, 5.0, 10.0, 0.999)])
def test_servers_a_backlog_keeps_busy_are_sized_for_a_wait_every_time(arrivals_s, service_s,
                                                                       budget_s, within):
    """Every server busy: a job waits for the runs ahead of it to end, ``c / s`` a
    second, less the lane's own arrivals: ``P(W > t) = exp(-(c - a) t / s)``."""
    servers = servers_for(arrivals_s, service_s, budget_s, within, busy=True)
    load = arrivals_s * service_s
    assert servers > load
    assert math.exp(-(servers - load) * budget_s / service_s) <= 1 - within + 1e-12
    assert servers - 1 <= load or \
        math.exp(-(servers - 1 - load) * budget_s / service_s) > 1 - within
    assert servers >= servers_for(arrivals_s, service_s, budget_s, within)


def test_no_arrivals_need_no_server():
    assert servers_for(0.0, 5.0, 10.0, 0.999) == 0
    assert needed([LaneDemand(0, 5, 0, 10), LaneDemand(0, 5, 0, 60), LaneDemand(0, 5)]) == 0


def test_a_lane_competes_with_the_lanes_above_it():
    fast = LaneDemand(2.0, 5.0, 0.0, 10.0, 0.999)
    standard = LaneDemand(2.0, 5.0, 0.0, 60.0, 0.95)
    assert needed([fast]) == servers_for(2.0, 5.0, 10.0, 0.999)
    assert needed([fast, standard]) >= servers_for(4.0, 5.0, 60.0, 0.95)
    relaxed = LaneDemand(10.0, 5.0, 6000.0)  # no budget: held to UNBUDGETED_S
    assert needed([fast, standard, relaxed]) == pytest.approx(max(
        servers_for(14.0, 5.0, UNBUDGETED_S, 0.95), 70 + 6000 / UNBUDGETED_S))


def test_queued_work_asks_for_more_workers():
    """Queued work the servers' spare capacity starts within the budget asks for
    nothing more; past that, for the load plus the queued work over the budget."""
    idle = needed([LaneDemand(1.0, 5.0, 0.0, 10.0, 0.999)])
    spare_s = (idle - 5.0) * 10.0
    assert needed([LaneDemand(1.0, 5.0, spare_s, 10.0, 0.999)]) == pytest.approx(idle)
    assert needed([LaneDemand(1.0, 5.0, 200.0, 10.0, 0.999)]) == pytest.approx(5 + 20)


def test_one_queued_job_keeps_a_small_pool_at_one_worker():
    """A pool at 0.4 busy workers: one 2 s job waiting behind a busy worker starts
    well within the 60 s budget, so it asks for no second worker; twenty such jobs
    (40 s of work) are more than one worker's spare capacity starts in time."""
    load = LaneDemand(0.2, 2.0, 0.0, 60.0, 0.95)
    assert needed([load]) == 1
    assert math.ceil(needed([LaneDemand(0.2, 2.0, 2.0, 60.0, 0.95)])) == 1
    assert math.ceil(needed([LaneDemand(0.2, 2.0, 40.0, 60.0, 0.95)])) == 2


def test_a_lane_with_no_budget_plans_a_backlog():
    """The relaxed lane needs the work of the lanes above it plus what starts its queued
    work within the planned wait; the budgeted lanes are then sized for busy servers."""
    fast = LaneDemand(2.0, 5.0, 0.0, 10.0, 0.999)
    standard = LaneDemand(2.0, 5.0, 30.0, 60.0, 0.95)
    relaxed = LaneDemand(10.0, 5.0, 6000.0)
    lanes = [fast, standard, relaxed]
    assert planned(lanes) == pytest.approx(20.0 + 6030.0 / PLANNED_WAIT_S)
    assert planned(lanes) < 70.0  # below the load (70 workers): the backlog grows
    assert planned([fast, standard]) == 0.0  # nothing that may wait
    assert needed(lanes, plan_backlog=True) == pytest.approx(max(
        servers_for(2.0, 5.0, 10.0, 0.999, busy=True),
        servers_for(4.0, 5.0, 60.0, 0.95, busy=True), 20.0 + 30.0 / 60.0))
    assert needed([fast, standard], plan_backlog=True) == needed([fast, standard])


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
    state = next_scale(Scale(), 50.0, 50.0, now=0.0, down_after_s=300, noise=1.0)
    assert state.wanted == 50
    state = next_scale(state, 48.0, 48.0, now=1.0, down_after_s=300, noise=1.0)  # too small
    for now in range(2, 303):
        state = next_scale(state, 20.0, 20.0, now=float(now), down_after_s=300, noise=1.0)
    assert state.wanted == 20


def test_a_step_down_passes_the_noise_of_the_need():
    """The step is NOISE_Z standard deviations of the need (at least one worker): a
    pool of a thousand steps by a few workers, not by a tenth of itself."""
    assert down_step(0.0) == 1 and down_step(5.0) == math.ceil(NOISE_Z * 5.0)
    state = next_scale(Scale(), 1000.0, 1000.0, now=0.0, down_after_s=300, noise=5.0)
    for now in range(1, 400):
        state = next_scale(state, 986.0, 986.0, now=float(now), down_after_s=300, noise=5.0)
    assert state.wanted == 1000  # 14 < 3 x 5: within the noise
    for now in range(400, 800):
        state = next_scale(state, 984.0, 984.0, now=float(now), down_after_s=300, noise=5.0)
    assert state.wanted == 984


def test_once_the_window_passed_wanted_follows_a_falling_need():
    """Past the first window, each round steps down to the most needed over the last
    window, without waiting for another window (as the HPA's stabilization window)."""
    state = next_scale(Scale(), 100.0, 100.0, now=0.0, down_after_s=300)
    for now in range(1, 1000):
        need = 100.0 - now / 10  # a worker less every ten seconds
        state = next_scale(state, need, need, now=float(now), down_after_s=300)
        if now >= 400:
            assert state.wanted == math.ceil(100.0 - (now - 300) / 10)


def test_wanted_never_steps_down_below_the_floor():
    state = next_scale(Scale(), 50.0, 50.0, now=0.0, down_after_s=300)
    for now in range(1, 400):
        state = next_scale(state, 10.0, 10.0, now=float(now), down_after_s=300, floor=41.5)
    assert state.wanted == 42
    assert next_scale(state, 10.0, 10.0, now=400.0, down_after_s=300, floor=30.0).wanted == 30


def test_wanted_stays_within_its_bounds():
    assert next_scale(Scale(), 0.0, 0.0, 0.0, 300, least=2).wanted == 2
    assert next_scale(Scale(), 500.0, 500.0, 0.0, 300, most=64).wanted == 64


#: Each lane's share of the jobs in the constant loads: a fifth fast, half standard, the
#: rest relaxed; and the budgets. Jobs of 5 s.
MIX, BUDGETS_S, JOB_S = (0.2, 0.5, 0.3), {"fast": 10.0, "standard": 60.0}, 5.0


@pytest.mark.parametrize("arrivals_s", [0.5, 4.0, 40.0, 400.0])
def test_a_constant_load_settles_and_then_changes_wanted_at_most_once(arrivals_s):
    """Poisson arrivals at a constant rate on a pool of ``wanted`` workers, as a fluid:
    every second its workers serve the lanes in priority order and what they leave
    stays queued; beat's round (``scale_round``) every second, for three simulated
    hours. Past the first ten minutes, ``wanted`` changes at most once; and the pool
    serves the load: its relaxed backlog starts within the planned wait."""
    draw, state, queued_s, changes = random.Random(7), {}, [0.0] * len(LANES), []
    for now in range(3 * 3600):
        count, wanted = _poisson(draw, arrivals_s), state.get("wanted", 0)
        free, busy = float(wanted), []
        for lane, share in enumerate(MIX):
            work_s = queued_s[lane] + count * share * JOB_S
            busy.append(min(free, work_s))
            free, queued_s[lane] = free - busy[-1], work_s - busy[-1]
        measures = {lane: LaneMeasure(busy[i], JOB_S, queued_s[i] / JOB_S)
                    for i, lane in enumerate(LANES)}
        state = scale_round(state, measures, BUDGETS_S, WITHIN, 1.0, 90.0, float(now), 300.0)
        if state["wanted"] != wanted and now >= 600:
            changes.append((now, wanted, state["wanted"]))
    assert len(changes) <= 1, changes
    budgeted = arrivals_s * (MIX[0] + MIX[1]) * JOB_S
    assert sum(queued_s[:2]) <= state["wanted"] * BUDGETS_S["fast"]
    assert queued_s[2] <= (state["wanted"] - budgeted) * PLANNED_WAIT_S


def test_a_backlog_at_its_planned_wait_asks_for_the_whole_load():
    """Once the relaxed backlog waits as planned, the need is the load at once (the
    backlog stops growing), not a worker more each time it grows on."""
    measures = {"fast": LaneMeasure(4.0, 5.0, 0.0), "standard": LaneMeasure(10.0, 5.0, 0.0),
                "relaxed": LaneMeasure(6.0, 5.0, 0.0)}
    old = {"wanted": 20, "at": 99.0, "rates": {"fast": [0.8, 0.8], "standard": [2.0, 2.0],
                                               "relaxed": [2.0, 2.0]}}
    calm = scale_round(old, measures, BUDGETS_S, WITHIN, 1.0, 90.0, 100.0, 300.0)
    assert calm["wanted"] == 20  # 24 workers of load: the backlog grows within its plan
    behind = {**measures, "relaxed": LaneMeasure(6.0, 5.0, 400.0)}  # 2,000 s of work
    late = scale_round(old, behind, BUDGETS_S, WITHIN, 1.0, 90.0, 100.0, 300.0)
    assert late["wanted"] >= 24


def test_jobs_queued_behind_a_busy_worker_let_a_small_pool_come_down_to_one():
    """A standard pool of 4 workers at 0.4 busy workers (2 s jobs), in which a job
    waits behind a busy worker every 30 s: it comes down to one worker. (Were each such
    job to ask for a second worker, it would restart the scale-down window, and the
    pool would stay at two.)"""
    state = {"wanted": 4}
    quiet = {"fast": LaneMeasure(0.0, 2.0, 0.0), "standard": LaneMeasure(0.4, 2.0, 0.0),
             "relaxed": LaneMeasure(0.0, 2.0, 0.0)}
    waiting = {**quiet, "standard": LaneMeasure(1.0, 2.0, 1.0)}
    for now in range(1500):
        measures = waiting if now % 30 == 0 else quiet
        state = scale_round(state, measures, BUDGETS_S, WITHIN, 1.0, 90.0, float(now), 300.0)
    assert state["wanted"] == 1


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
