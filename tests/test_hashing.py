"""Route hashing: consistent hashing with bounded loads, pure and on real workers."""
from __future__ import annotations

import collections
import json

import pytest
from conftest import SMALL, wait_until

from routing.names import worker_queue
from routing.placement import assign_homes, home, model_mb, ring, touched
from routing.policy import PolicyView, decide
from routing.snapshot import SnapshotCache
from tasks import submit
from tasks.broker.keys import WORKERS_KEY

MODELS = [f"model-{i}" for i in range(2000)]


def test_each_model_has_a_stable_home_spread_evenly():
    hash_ring = ring(["w0", "w1", "w2", "w3"])
    homes = [home(m, hash_ring, {}, 0.25) for m in MODELS]
    assert homes == [home(m, hash_ring, {}, 0.25) for m in MODELS]  # deterministic
    counts = collections.Counter(homes)
    assert set(counts) == {"w0", "w1", "w2", "w3"}
    assert max(counts.values()) < 1.3 * len(MODELS) / 4


def test_a_joining_worker_takes_about_one_nth_of_the_models():
    before = {m: home(m, ring(["w0", "w1", "w2", "w3"]), {}, 0.25) for m in MODELS}
    after = {m: home(m, ring(["w0", "w1", "w2", "w3", "w4"]), {}, 0.25) for m in MODELS}
    moved = [m for m in MODELS if before[m] != after[m]]
    assert all(after[m] == "w4" for m in moved)  # only to the newcomer
    assert 0.12 < len(moved) / len(MODELS) < 0.28  # about 1/5


def test_homes_never_outnumber_a_workers_slots_and_stay_put():
    hash_ring = ring(["w0", "w1", "w2", "w3"])
    slots = dict.fromkeys(["w0", "w1", "w2", "w3"], 2)
    wanted = [f"demo-{i}" for i in range(10)]  # most wanted first
    homes = assign_homes(wanted, hash_ring, slots)
    assert sorted(collections.Counter(homes.values()).values()) == [2, 2, 2, 2]
    assert set(homes) == set(wanted[:8])  # the two least wanted get no home
    assert homes["demo-0"] == home("demo-0", hash_ring, {}, 0.25)  # the hottest: its ring home
    # the wanted models' demand order shuffles (noise): every one keeps its home
    assert assign_homes(wanted[7::-1], hash_ring, slots, previous=homes) == homes
    assert assign_homes(wanted[7::-1], hash_ring, slots) != homes  # (it would move without)
    first = homes["demo-5"]
    assert home("demo-5", hash_ring, {}, 0.25, first=first) == first


def test_homes_are_bounded_by_memory_not_by_count():
    hash_ring = ring(["w0", "w1"])
    budgets = {"w0": 300, "w1": 300}  # MB
    sizes = {"large": 250, **{f"small-{i}": 90 for i in range(6)}, "huge": 400}
    wanted = ["large", "huge", *(f"small-{i}" for i in range(6))]
    homes = assign_homes(wanted, hash_ring, budgets, sizes=sizes)
    assert "huge" not in homes  # fits no worker: plain ring order
    taken = collections.defaultdict(int)
    for model, node in homes.items():
        taken[node] += sizes[model]
    assert all(used <= 300 for used in taken.values()), dict(taken)
    alone = homes["large"]  # the large model fills its worker alone...
    assert [m for m, n in homes.items() if n == alone] == ["large"]
    # ... while three small ones share the other (a fourth would not fit)
    assert sorted(m for m, n in homes.items() if n != alone) == \
        [f"small-{i}" for i in range(3)]
    # the LRU view of a worker follows the same sizes: the large one evicts the others
    smalls = ("small-0", "small-1", "small-2")
    assert touched(smalls, "large", 300, sizes) == ("large",)
    assert touched(("large",), "small-0", 300, sizes) == ("small-0",)
    assert touched(("small-0", "small-1"), "small-2", 300, sizes) == smalls
    # a size not known yet counts as the largest known one
    assert model_mb("new", sizes, 300) == 400 and model_mb("new", {}, 300) == 150


def test_an_overloaded_home_passes_jobs_to_the_next_on_the_ring():
    hash_ring = ring(["w0", "w1", "w2", "w3"])
    model = "model-7"
    first = home(model, hash_ring, {}, 0.25)
    busy = {first: 10}  # mean with this job: 11/4; cap ceil(1.25 * 2.75) = 4
    second = home(model, hash_ring, busy, 0.25)
    assert second != first
    assert home(model, hash_ring, {first: 1}, 0.25) == first  # one job waiting: stays
    # both at the cap (mean 7/4, cap 3): the next worker on the ring
    assert home(model, hash_ring, {first: 3, second: 3}, 0.25) not in (first, second)



def test_a_busy_warm_worker_keeps_the_job_while_waiting_beats_a_cold_load():
    hash_ring = ring(["w0", "w1", "w2", "w3"])
    model = "model-7"
    first = home(model, hash_ring, {}, 0.25)
    warm = {first: ("model-7",)}
    busy = {first: 4}  # over the cap (mean 5/4, cap 2): 4 jobs of 0.1 s to wait for
    drain = dict.fromkeys(["w0", "w1", "w2", "w3"], 0.1)
    assert home(model, hash_ring, busy, 0.25, warm, drain, cold_s=2.0) == first
    assert home(model, hash_ring, busy, 0.25, warm, drain, cold_s=0.1) != first
    assert home(model, hash_ring, busy, 0.25, warm) != first  # no service times: no waiting


def test_a_fast_job_goes_to_a_warm_worker_running_no_fast_job():
    hash_ring = ring(["w0", "w1", "w2", "w3"])
    model = "model-7"
    first = home(model, hash_ring, {}, 0.25)
    other = next(w for w in ("w0", "w1", "w2", "w3") if w != first)
    warm = {first: (model,), other: (model,)}
    loads = {first: 1, other: 3}  # the home runs a fast job; the other holds 3 relaxed
    fast = {first: 1}
    # by the load alone the home keeps it, behind a job no fast job preempts...
    assert home(model, hash_ring, loads, 0.25, warm, first=first) == first
    # ... by the fast work, the other holder: it goes ahead of the relaxed jobs there
    assert home(model, hash_ring, loads, 0.25, warm, first=first, fast_loads=fast) == other
    route = decide("fast", "a", False, PolicyView(ring=hash_ring, loads=loads, warm=warm,
                                                  fast_loads=fast, homes={model: first}),
                   model=model)
    assert route.node == other
    # no fast work anywhere: bounded loads, as before
    assert home(model, hash_ring, loads, 0.25, warm, first=first, fast_loads={}) == first
    assert home(model, hash_ring, {first: 5}, 0.25, warm, first=first, fast_loads={}) \
        == home(model, hash_ring, {first: 5}, 0.25, warm, first=first) == other
    standard = decide("standard", "a", True, PolicyView(
        ring=hash_ring, loads=loads, warm=warm, fast_loads=fast, homes={model: first}),
        model=model)
    assert standard.node == first  # other lanes are placed by the whole load, as before


def test_a_fast_job_waits_for_a_warm_fast_job_only_while_that_beats_a_cold_load():
    hash_ring = ring(["w0", "w1", "w2", "w3"])
    model = "model-7"
    first = home(model, hash_ring, {}, 0.25)
    warm, drain = {first: (model,)}, dict.fromkeys(["w0", "w1", "w2", "w3"], 2.0)
    fast = {first: 2}  # a fast job running and one waiting: about 4 s
    placed = [home(model, hash_ring, {}, 0.25, warm, drain, cold_s=cold, first=first,
                   fast_loads=fast) for cold in (5.0, 3.0)]
    assert placed[0] == first
    assert placed[1] != first and placed[1] in hash_ring[1]  # loads cold where none waits


def test_the_fast_work_counts_a_model_loading():
    from routing.compact import fast_work
    assert fast_work({"in_flight": {"relaxed": 1}}) == 0  # preempted at its next step
    assert fast_work({"in_flight": {"relaxed": 1}, "loading_models": ["m"]}) == 1
    assert fast_work({"in_flight": {"fast": 1}, "loading_models": ["m"],
                      "queued_fast": 2}) == 3


def test_the_router_counts_its_own_sends_until_the_next_snapshot():
    now = [100.0]
    snapshot = {"at": 100.0, "measured_at": 100.0, "workers": {
        host: {"alive": True, "in_flight": {}, "queued": 0, "memory_mb": 4000,
               "model_mb": {"a": 2000, "b": 2000}, "concurrency": 1,
               "warm_models": ["a", "b"], "service_ms": {"standard": 100.0}}
        for host in ("w0", "w1")}}
    cache = SnapshotCache(lambda: json.dumps(snapshot), refresh_s=0.5, stale_s=3.0,
                          max_depth={"fast": 9, "standard": 9, "relaxed": 9},
                          clock=lambda: now[0])
    cache._thread = object()  # refreshes by hand
    cache.refresh()
    for _ in range(3):
        cache.note_sent("standard", "w0", "c")
    view = cache.view()
    assert view.warm["w0"] == ("b", "c") and view.warm["w1"] == ("a", "b")  # c evicted a
    assert view.loads == {"w0": 3, "w1": 0}
    assert view.fast_loads == {"w0": 0, "w1": 0}  # no fast job among them
    cache.note_sent("fast", "w1", "a")
    assert cache.view().fast_loads == {"w0": 0, "w1": 1}
    assert cache.view().loads == {"w0": 3, "w1": 1}
    now[0] = 100.2  # two jobs' service time later: about two of them are done
    assert cache.view().loads["w0"] == pytest.approx(1.0)
    snapshot.update(at=101.0, measured_at=101.0)  # a snapshot that counts them itself
    cache.refresh()
    assert cache.view().warm["w0"] == ("a", "b") and cache.view().loads["w0"] == 0


def test_no_healthy_worker_means_the_shared_lane():
    assert home("m", ring([]), {}, 0.25) is None
    route = decide("fast", "a", False, PolicyView(), model="m")
    assert route.node is None and route.queue == "fast"
    routed = decide("fast", "a", False, PolicyView(ring=ring(["w0"])), model="m")
    assert routed.node == "w0" and routed.queue == worker_queue("fast", "w0")
    assert routed.as_dict() == {"lane": "fast", "requested_tier": "fast"}


@pytest.fixture(scope="module")
def cluster(cluster_factory):
    return cluster_factory(workers=2, beat=True, env={"GPULANES_MODEL_MEMORY_MB": "4"})


def _routed_view(clean_redis, hosts):
    def ready():
        records = clean_redis.hgetall(WORKERS_KEY)
        alive = [h.decode() for h, w in records.items() if json.loads(w).get("alive")]
        return sorted(alive) == sorted(hosts)
    wait_until(ready, timeout_s=30, what="both workers in the snapshot")
    from tasks.broker.view import snapshot_cache
    wait_until(lambda: (v := snapshot_cache().view()) and len(set(v.ring[1])) == 2,
               timeout_s=10, what="the router to see both workers")


@pytest.mark.cluster
def test_each_models_jobs_run_on_one_warm_worker(cluster, clean_redis):
    """A model's jobs keep to a worker holding it warm; only a model warm on every worker
    goes to the shared lane, where whichever worker is free runs it, still warm."""
    _routed_view(clean_redis, cluster.hostnames)
    runs, cold_after_first = collections.defaultdict(set), collections.Counter()
    cold = 0
    for i in range(24):
        model = ("demo", "demo-0", "demo-1", "demo-2")[i % 4]
        out = submit(f"job {i}", model=model, seed=i, **SMALL).get(timeout=120)
        cold_after_first[model] += bool(runs[model]) and out["cold_start"]
        runs[model].add(out["worker"])
        cold += out["cold_start"]
    # room for two models a worker, four models: of the 20 jobs after each model's first,
    # 18 or more run warm. Routing blind to warmth would load a model again at about every
    # other job. Not all 20: a worker the router has not measured yet seems busy while it
    # counts its own sends as that worker's load, and on a busy host the snapshot that
    # tells a model warm where it was just loaded can lag, so a job may go cold elsewhere.
    assert sum(cold_after_first.values()) <= 2, (dict(cold_after_first), dict(runs))
    assert sum(len(workers) == 1 for workers in runs.values()) >= 2, dict(runs)
    assert cold <= 6  # one cold load per model, then warm (with those two at most)


def test_a_route_key_keeps_its_jobs_on_one_warm_worker_and_keys_spread():
    """A model's route key (a LoRA's name) is the job's point on the ring: each key's jobs
    land on one worker, the keys spread over the model's warm workers, and without a key
    the model's home takes them all."""
    nodes = [f"gpu{i}@h" for i in range(4)]
    view = PolicyView(ring=ring(nodes), warm={n: ("sd",) for n in nodes[:3]},
                      homes={"sd": nodes[2]})
    keyed = {key: decide("standard", "a", False, view, "sd", route_key=key).node
             for key in (f"lora-{i}" for i in range(24))}
    again = {key: decide("standard", "a", False, view, "sd", route_key=key).node
             for key in keyed}
    assert again == keyed and len(set(keyed.values())) >= 3
    assert {decide("standard", "a", False, view, "sd").node for _ in range(5)} == {nodes[2]}
    # warm on every worker: the keys still spread, a job without one takes the shared lane
    everywhere = view.but(warm={n: ("sd",) for n in nodes})
    assert {decide("standard", "a", False, everywhere, "sd", route_key=key).node
            for key in keyed} == set(nodes)
    assert decide("standard", "a", False, everywhere, "sd").node is None


def test_a_models_route_key_travels_with_its_job():
    from tasks.broker.message import Job
    from tasks.jobs.schema import check_job, validate

    job = validate(model="odd", kind="steps", lora="paper-cut")
    assert job.route_key == "lora:paper-cut"
    assert Job.decode(job.encode()).route_key == "lora:paper-cut"
    assert check_job(job.encode()).route_key == "lora:paper-cut"
    assert validate(model="odd", kind="steps").route_key is None
