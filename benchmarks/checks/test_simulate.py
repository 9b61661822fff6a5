"""The scheduling simulator (``benchmarks.simulate``): small runs, a few seconds in all."""
from __future__ import annotations

import json

import pytest

from benchmarks.simulate.__main__ import main
from benchmarks.simulate.config import SimConfig
from benchmarks.simulate.metrics import mode_changes
from benchmarks.simulate.queues import read_order
from benchmarks.simulate.run import Fleet, Run
from benchmarks.simulate.scenarios import SCENARIOS, Scenario, run_scenario
from benchmarks.simulate.workload import Arrival, ModelSpec, Profile, constant
from gpu_worker.runtime import EWMA_ALPHA
from routing.names import RELAX_PRIORITIES, worker_queues
from tasks.broker.bindings import lists

SMALL = Profile(models=12, heavy_accounts=3, light_accounts=40)


def _run(name: str = "load-1x", gpus: int = 12, window_s: float = 60.0, seed: int = 3,
         modes: tuple[str, ...] = ("gpulanes", "plain")) -> dict:
    return run_scenario(SCENARIOS[name], gpus, window_s, seed, profile=SMALL, modes=modes)


def _trace(outcome) -> list[tuple]:
    return [(job.id, job.worker, job.started_at, job.lane, job.reason)
            for job in outcome.recorder.done]


def test_a_run_is_the_same_for_the_same_seed() -> None:
    first, again = _run(), _run()
    for mode in ("gpulanes", "plain"):
        a, b = first["outcomes"][mode], again["outcomes"][mode]
        assert _trace(a) == _trace(b)
        assert {**a.figures, "sim_cpu_s": 0} == {**b.figures, "sim_cpu_s": 0}
    assert _trace(_run(seed=4)["outcomes"]["gpulanes"]) != _trace(first["outcomes"]["gpulanes"])


def _served_once(outcome) -> None:
    done = outcome.recorder.done
    ids = [job.id for job in done]
    assert len(ids) == len(set(ids)) == outcome.accepted
    assert all(job.served == 1 and job.finished_at >= job.started_at for job in done)
    assert outcome.figures["served"] + outcome.figures["refused"] == outcome.figures["offered"]


@pytest.mark.parametrize("mode", ["gpulanes", "plain"])
def test_every_job_is_served_exactly_once_even_when_workers_die(mode: str) -> None:
    # a third of the workers die mid-run while running jobs, and come back
    deaths = Scenario("deaths", lambda _w, _s: constant(1.2), 1.2, faults=((0.34, 0.3, 20.0),))
    found = run_scenario(deaths, 12, 60.0, 5, profile=SMALL, modes=(mode,))
    outcome = found["outcomes"][mode]
    _served_once(outcome)
    assert any(job.attempts > 1 for job in outcome.recorder.done), "no run was cut short"
    _served_once(_run()["outcomes"][mode])


def test_plain_lanes_serve_each_tier_first_in_first_out() -> None:
    outcome = _run("load-2x", modes=("plain",))["outcomes"]["plain"]
    for tier in ("fast", "standard", "relaxed"):
        jobs = sorted((j for j in outcome.recorder.done if j.arrival.tier == tier),
                      key=lambda j: j.started_at)
        assert [j.id for j in jobs] == sorted(j.id for j in jobs)
        assert all(j.lane == tier and j.reason is None for j in jobs)


def test_mode_changes_under_noisy_load_are_counted() -> None:
    # budgets a small fleet's noisy load keeps crossing: the hysteresis must act (with
    # idle workers taking queued work, 12 workers keep standard under 8 s but for 2 rounds)
    config = SimConfig(budgets_s={"fast": 2.0, "standard": 6.0})
    found = run_scenario(SCENARIOS["noisy"], 12, 240.0, 3, config, SMALL, ("gpulanes",))
    outcome = found["outcomes"]["gpulanes"]
    rounds = [r for r in outcome.recorder.rounds if r["t"] <= 240.0]
    switches = {lane: sum((lane in a["overloaded"]) != (lane in b["overloaded"])
                          for a, b in zip([{"overloaded": []}, *rounds], rounds))
                for lane in ("fast", "standard")}
    assert switches["standard"] >= 4, switches
    assert outcome.figures["mode_changes"] == switches
    assert outcome.figures["mode_changes_per_min"] == round(sum(switches.values()) / 4, 3)
    # and the policy did move standard jobs down while standard was overloaded
    assert outcome.figures["downgrades"].get("standard_overloaded", 0) > 0


def test_mode_changes_count_each_switch_of_each_lane() -> None:
    states = [[], ["fast"], ["fast"], ["fast", "standard"], [], ["standard"]]
    assert mode_changes({"overloaded": s} for s in states) == {"fast": 2, "standard": 3}


def test_workers_read_their_lists_in_the_takes_order() -> None:
    # the take (tasks.broker.bindings.lists): lane by lane, level by level in a lane
    node = "gpu0@h"
    assert read_order(node) == lists(worker_queues(node), RELAX_PRIORITIES)
    assert read_order(node)[:2] == [f"fast.{node}", "fast"]


def test_json_has_the_figures(tmp_path) -> None:
    path = tmp_path / "sim.json"
    assert main(["--gpus", "10", "--minutes", "0.5", "--scenarios", "load-1x,load-2x",
                 "--no-plots", "--json", str(path)]) == 0
    report = json.loads(path.read_text())
    for name in ("load-1x", "load-2x"):
        result = report["scenarios"][name]
        for mode in ("gpulanes", "plain"):
            figures = result["modes"][mode]
            assert set(figures["lanes"]["fast"]) == {"jobs", "p50", "p95", "p99"}
            assert set(figures["within_budget"]) == {"fast", "standard", "relaxed"}
            for key in ("mode_changes_per_min", "cold_loads", "served_jobs_s", "relaxed_accounts",
                        "fast_allowed_within_budget"):
                assert key in figures
        assert {"served_jobs_s", "standard_within_budget", "fast_within_budget",
                "worst_wait_s", "plain_p99_wait_s"} <= set(result["versus"])


def _one_worker(arrivals: list[Arrival], mode: str) -> tuple[Run, object]:
    spec = ModelSpec("m", 0.0, 0.0, 0.0)
    run = Run(arrivals, [spec], Fleet(1, memory_mb=(1,)), mode, SimConfig(), window_s=30.0)
    return run, run.go()


def test_a_fast_job_preempts_a_relaxed_run_at_its_next_step() -> None:
    jobs = [Arrival(0.0, "relaxed", "a", False, "m", 1.0, 9.0, steps=30),
            Arrival(2.05, "fast", "b", False, "m", 1.0, 1.0, steps=30)]
    run, outcome = _one_worker(jobs, "gpulanes")
    relaxed, fast = sorted(outcome.recorder.done, key=lambda job: job.id)
    assert outcome.figures["preempted"] == 1 and relaxed.preemptions == 1
    assert 0 < fast.wait_s <= 9.0 / 30 + 1e-9  # the relaxed run's next step boundary
    # it resumed where it stopped: 9 s of steps in all, the fast job's second between
    assert relaxed.finished_at == pytest.approx(run.start + 9.0 + 1.0)
    _, plain = _one_worker(jobs, "plain")
    assert max(job.wait_s for job in plain.recorder.done) == pytest.approx(9.0 - 2.05)


def test_a_run_about_to_end_is_not_preempted() -> None:
    # under preempt_min_left_s (a tenth of the fast budget: 1 s) left: it ends first
    jobs = [Arrival(0.0, "relaxed", "a", False, "m", 1.0, 9.0, steps=30),
            Arrival(8.5, "fast", "b", False, "m", 1.0, 1.0, steps=30)]
    _, outcome = _one_worker(jobs, "gpulanes")
    fast = max(outcome.recorder.done, key=lambda job: job.id)
    assert outcome.figures["preempted"] == 0
    assert fast.wait_s == pytest.approx(0.5)


def test_a_run_is_told_of_a_fast_job_after_the_one_before_it_was_told_too() -> None:
    """Job A is told of fast job F1 in its last second (it runs on); after F1, job B
    begins; fast job F2 preempts B at its next step. Every job's first run has the same
    token: a worker that remembered only the token took B's news for A's, and F2
    waited all of B."""
    jobs = [Arrival(0.0, "relaxed", "a", False, "m", 1.0, 9.0, steps=30),
            Arrival(0.1, "relaxed", "c", False, "m", 1.0, 9.0, steps=30),
            Arrival(8.5, "fast", "b", False, "m", 1.0, 1.0, steps=30),
            Arrival(12.0, "fast", "d", False, "m", 1.0, 1.0, steps=30)]
    _, outcome = _one_worker(jobs, "gpulanes")
    second_fast = max(outcome.recorder.done, key=lambda job: job.id)
    assert outcome.figures["preempted"] == 1
    assert second_fast.wait_s <= 9.0 / 30 + 1e-9


def test_a_worker_measures_the_time_between_jobs_apart_from_their_runs() -> None:
    """Real workers time a job's run from prerun to postrun; the ack and the next fetch
    keep them busy between runs (``SimConfig.unmeasured_s``), which they time apart
    while a job waits for them (``Runtime.between_jobs``)."""
    spec = ModelSpec("m", 0.0, 0.0, 0.0)
    jobs = [Arrival(0.0, "standard", "a", False, "m", 1.0, 0.5, steps=10)] * 7
    config = SimConfig(unmeasured_s=0.1)
    run = Run(jobs, [spec], Fleet(1, memory_mb=(1,)), "gpulanes", config, window_s=5.0)
    outcome = run.go()
    done = sorted(outcome.recorder.done, key=lambda job: job.id)
    assert [b.started_at - a.started_at for a, b in zip(done, done[1:])] == \
        [pytest.approx(0.5)] * 6  # the worker busy the whole 0.5 s a job
    worker = next(iter(run.cluster.workers.values()))
    # each of the six later jobs waited for the worker, which took 100 ms between
    assert list(worker.runtime.between_ms) == [pytest.approx(100.0)] * 6
    # five jobs' runs alone (400 ms: too few times between yet), then two jobs' runs
    # with the time between (500 ms), in the moving average
    after_five = 400.0 + EWMA_ALPHA * 100.0
    assert worker.runtime.service_ms["standard"] == pytest.approx(
        after_five + EWMA_ALPHA * (500.0 - after_five))


def test_a_small_pool_past_capacity_keeps_standard_jobs_in_budget(tmp_path) -> None:
    """overload.py's workload (``benchmarks.simulate.pool``): fast and standard alone
    offer 1.4x a two-worker pool; the admission lets in as many standard jobs as can
    start within budget, with a margin for the fast jobs that may come meanwhile, and
    the workers' time between jobs counted in what they report."""
    from benchmarks.simulate.pool import main as pool

    out = tmp_path / "pool.json"
    assert pool(["--duration", "12", "--seeds", "7", "--json", str(out)]) == 0
    (seed,) = json.loads(out.read_text())["seeds"]
    gpulanes, plain = seed["gpulanes"], seed["plain"]
    assert seed["standard_most"] == 0.5  # (1 - 0.3 x 2) / (0.4 x 2)
    standard = gpulanes["within_budget"]["standard"]
    assert standard >= 0.8 * seed["standard_most"]
    assert standard >= plain["within_budget"]["standard"] + 0.2
    assert gpulanes["within_budget"]["fast"] >= 0.99
    moved = gpulanes["downgrades"]
    assert moved["standard_overloaded"] > 10 * moved.get("waited_past_budget", 0)
    assert gpulanes["served_jobs_s"] >= 0.97 * plain["served_jobs_s"]


def test_validation_sets_a_jobs_time_against_the_service_the_workers_report() -> None:
    from benchmarks.simulate.validate import unmeasured_s

    jobs = [{"started_at": float(i), "run_s": 0.020, "extra_s": 0.010,
             "lane": "fast" if i % 3 else "relaxed"} for i in range(90)]
    jobs[-1]["run_s"] = 0.5  # a relaxed job: 1/30 of the lane's recent ones
    found = unmeasured_s(jobs, 0.010, {"fast": 0.021, "relaxed": 0.030})
    assert found == pytest.approx((50 * 0.009 + 30 * (0.0 + 0.48 / 30)) / 80)
    assert unmeasured_s(jobs, 0.010, None) == 0.0
    assert unmeasured_s(jobs, 0.010, {"fast": 0.05, "relaxed": 0.05}) == 0.0


def test_an_idle_worker_takes_the_youngest_queued_job_of_a_model_it_holds() -> None:
    """Beat's round hands the youngest job of a busy worker's own queue to an idle
    worker holding its model (``beat.balance``), not to one that would load it."""
    from benchmarks.simulate.router import new_job
    from routing.names import worker_queue

    run = Run([], [ModelSpec("m", 0.0, 0.0, 5.0), ModelSpec("x", 0.0, 0.0, 5.0)],
              Fleet(3, memory_mb=(1,), prewarm=False), "gpulanes", SimConfig(), window_s=30.0)
    busy, holder, other = run.cluster.workers.values()
    for worker, model in ((busy, "m"), (holder, "m"), (other, "x")):
        worker.load(model, 0.0)
    busy.runtime.job_started("standard")  # one job done before: its pace, 9 s a job
    busy.runtime.job_finished("standard", 9000.0, "m", 1.0)
    run.cluster.start_all()
    jobs = [new_job(i, Arrival(0.0, "standard", "a", False, "m", 1.0, 9.0), run.clock.now)
            for i in range(3)]
    for job in jobs:  # the first runs on `busy`, two wait in its own queue
        run.cluster.push(job, worker_queue("standard", busy.host))
    run.beat._push(list(run.cluster.workers))
    run.beat.round()  # (a fresh record: no job waited a heartbeat yet)
    assert holder.running is jobs[2] and busy.running is jobs[0]
    assert other.running is None
    assert run.lists.lists[worker_queue("standard", busy.host)][0] is jobs[1]


def test_validation_replays_a_job_published_just_before_a_slot_frees_after_the_next_one():
    """A worker takes its next job a pick lag before it starts it: a fast job published
    inside that lag runs after the relaxed job the worker took already."""
    from benchmarks.simulate.validate import pick_lag_s, simulated

    trial = {"hosts": ["gpu0@sim"], "steps": 1, "job_s": 0.1, "overhead_s": 0.0,
             "budgets_s": {"fast": 10.0, "standard": 60.0}, "heartbeat_s": 1.0,
             "heartbeat_reply_s": 0.5, "pickup_s": 0.003, "pickups_s": [0.003] * 9 + [0.004],
             "preempt": False}
    # the first job starts 3 ms after its stamp and frees the worker at 0.103 s; the
    # fast job, stamped at 0.1015 s, is published after that
    jobs = [{"submitted": 100.0, "tier": "relaxed", "run_s": 0.1, "preempted": 0},
            {"submitted": 100.01, "tier": "relaxed", "run_s": 0.1, "preempted": 0},
            {"submitted": 100.1015, "tier": "fast", "run_s": 0.1, "preempted": 0}]
    lag = pick_lag_s({"0.5x": {"trial": trial}})
    assert lag == 0.003 and pick_lag_s({}) == 0.0
    waits = {job["lane"]: job["wait_s"] for job in simulated(jobs, {**trial, "pick_lag_s": lag})}
    assert waits["fast"] > 0.1  # behind the relaxed job the worker took before
    waits = {job["lane"]: job["wait_s"] for job in simulated(jobs, trial)}
    assert waits["fast"] < 0.01  # with no lag it would have been taken first
