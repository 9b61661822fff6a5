"""The split snapshot (routing.compact) and routing at fleet scale, pure: the parts round
trip, and a router fed them makes the choices it made before, from full snapshots."""
from __future__ import annotations

import bisect
import functools
import hashlib
import json
import math
import random
from collections import deque

import pytest

from routing.compact import (DRAIN_S, U16_MAX, drain_code, in_order, rank_of, slice_ranks,
                             split, unpack_u8, unpack_work)
from routing import compact
from routing.fleet import build_fleet, measure
from routing.fluid import Draining, DrainingSum
from routing import hashring
from routing.hashring import derive, ring
from routing.placement import DELAY_HOLDERS, assign_homes, home, serving
from routing.policy import decide
from routing.ringorder import changed_set, in_ring_order
from routing.snapshot import DEMAND_WINDOW, SnapshotCache
from routing.views import Loads
from tests.harness.fleet import fleet_snapshot

# --- the implementation before the split, kept as the reference --------------------------
OLD_VNODES, OLD_MIN_CAP = 64, 2


def old_point(key):
    return int.from_bytes(hashlib.blake2b(key.encode(), digest_size=8).digest(), "big")


def old_ring(nodes):
    points = sorted((old_point(f"{node}#{v}"), node) for node in set(nodes)
                    for v in range(OLD_VNODES))
    return tuple(p for p, _ in points), tuple(n for _, n in points)


@functools.lru_cache(maxsize=None)
def ring_of(nodes):
    """``old_ring`` of a tuple of nodes, built once (the tests ask for the same ones)."""
    return old_ring(nodes)


def old_ring_order(model, points, owners, nodes):
    start, order = bisect.bisect(points, old_point(model)), []
    for step in range(len(points)):
        node = owners[(start + step) % len(points)]
        if node not in order:
            order.append(node)
            if len(order) == nodes:
                break
    return order


def old_assign_homes(models, hash_ring, slots, previous=None):
    points, owners = hash_ring
    nodes, taken, homes = len(set(owners)), dict.fromkeys(owners, 0), {}
    for model in models:
        walk = old_ring_order(model, points, owners, nodes)
        if (previous or {}).get(model) in taken:
            walk.insert(0, previous[model])
        for node in walk:
            if taken[node] < slots.get(node, 1):
                homes[model], taken[node] = node, taken[node] + 1
                break
    return homes


def old_home(model, hash_ring, loads, epsilon, warm=None, drain_s=None, cold_s=0.0,
             first=None, key=None, cap=None):
    """``cap``: given for a fast job (its ``loads`` the fast work), else bounded loads."""
    points, owners = hash_ring
    nodes = set(owners)
    if not nodes:
        return None
    warm = warm or {}
    if key is None and all(model in warm.get(node, ()) for node in nodes):
        return None  # warm on every worker: the shared lane
    if cap is None:
        mean = (sum(loads.get(n, 0) for n in nodes) + 1) / len(nodes)
        cap = max(OLD_MIN_CAP, math.ceil((1 + epsilon) * mean))
    order = old_ring_order(key or model, points, owners, len(nodes))
    if first in nodes:
        order = [first] + [node for node in order if node != first]
    open_nodes = [node for node in order if loads.get(node, 0) < cap]
    holding = [node for node in order if model in warm.get(node, ())]
    warm_open = [node for node in holding if node in open_nodes]
    if warm_open or not open_nodes:
        return (warm_open or holding or order)[0]
    if holding and drain_s:
        def wait_s(node):
            return loads.get(node, 0) * drain_s.get(node, 0.0)
        soonest = min(holding, key=wait_s)
        if wait_s(soonest) <= cold_s + wait_s(open_nodes[0]):
            return soonest
    return open_nodes[0]


def old_fast_home(model, hash_ring, loads, fast, epsilon, warm, drain_s, cold_s, first, key):
    """A fast job: the bounded-loads choice of a warm worker unless it has fast work
    (half a job or more); then the first holder without, else the delay rule over the
    fast work."""
    points, owners = hash_ring
    nodes = set(owners)
    holds = [node for node in old_ring_order(key or model, points, owners, len(nodes))
             if model in warm.get(node, ())]
    if nodes and (key is not None or len(holds) < len(nodes)):
        cap = max(OLD_MIN_CAP, math.ceil((1 + epsilon) * (sum(
            loads.get(n, 0) for n in nodes) + 1) / len(nodes)))
        # the model's home, then the first in ring order (the home met there again)
        for candidates in ([first] if first in holds else []), holds:
            chosen = next((n for n in candidates if loads.get(n, 0) < cap), None)
            if chosen is not None and fast.get(chosen, 0) < 0.5:
                return chosen
    return old_home(model, hash_ring, fast, epsilon, warm, drain_s, cold_s, first, key,
                    cap=0.5)


def old_touched(warm, model, slots):
    kept = tuple(m for m in warm if m != model) + (model,)
    return kept[-max(1, slots):]


def old_base(snapshot):
    """The old ``base_view``'s placement fields, with the drain carried at the compact
    code's resolution and cold loads to the millisecond (the two roundings of the split)."""
    routable = {h: w for h, w in snapshot.get("workers", {}).items() if serving(w)}
    drain = {}
    for host, worker in routable.items():
        samples = [ms for ms in worker.get("service_ms", {}).values() if ms]
        if samples:
            seconds = sum(samples) / len(samples) / 1000 / worker.get("concurrency", 1)
            drain[host] = DRAIN_S[drain_code(seconds)]
    known = sorted(drain.values())
    loaded = {}
    for worker in routable.values():
        for model, load_ms in worker.get("load_ms", {}).items():
            loaded.setdefault(model, []).append(load_ms / 1000)
    cold = {model: round(sum(s) / len(s), 3) for model, s in loaded.items()}
    return {
        "ring": old_ring(routable),
        "loads": {h: sum(w.get("in_flight", {}).values()) + w.get("queued", 0)
                  for h, w in routable.items()},
        "fast": {h: max(w.get("in_flight", {}).get("fast", 0),
                        1 if w.get("loading_models") else 0) + w.get("queued_fast", 0)
                 for h, w in routable.items()},
        "warm": {h: tuple(dict.fromkeys([*w.get("warm_models", ()),
                                         *w.get("loading_models", ())]))
                 for h, w in routable.items()},
        "slots": {h: w.get("memory_mb", 1) for h, w in routable.items()},
        "drain_s": {h: drain.get(h, known[len(known) // 2]) for h in routable} if known
        else {},
        "cold_s": cold, "cold_default_s": sum(cold.values()) / len(cold) if cold else 0.0,
    }


class OldRouter:
    """The router before the split: its view of loads and warm models after its own
    sends, and its homes, from full snapshots (``SnapshotCache`` as it was)."""

    def __init__(self, clock, stale_s, epsilon=0.25):
        self.clock, self.stale_s, self.epsilon = clock, stale_s, epsilon
        self.log, self.recent, self.demand = deque(), deque(), {}
        self.base, self.homes = None, {}

    def apply(self, snapshot):
        previous = self.homes if self.base is not None else None
        self.snapshot, self.base = snapshot, old_base(snapshot)
        self.rehome(previous)
        measured_at = snapshot.get("measured_at", snapshot["at"])
        while self.log and self.log[0][0] < measured_at:
            self.log.popleft()
        self.node_sent, self.fast_sent, self.warm = {}, {}, dict(self.base["warm"])
        for _, lane, node, model in self.log:
            self._apply(lane, node, model)

    def rehome(self, previous):
        wanted = sorted((m for m, n in self.demand.items() if n),
                        key=lambda m: (-self.demand[m], m))
        self.homes = old_assign_homes(wanted, self.base["ring"], self.base["slots"], previous)

    def _apply(self, lane, node, model):
        if node is not None and node in self.warm:
            self.node_sent[node] = self.node_sent.get(node, 0) + 1
            if lane == "fast":
                self.fast_sent[node] = self.fast_sent.get(node, 0) + 1
            self.warm[node] = old_touched(self.warm[node], model,
                                          self.base["slots"].get(node, 1))

    def note_sent(self, lane, node, model):
        now = self.clock()
        while self.log and self.log[0][0] < now - self.stale_s:
            self.log.popleft()
        self.log.append((now, lane, node, model))
        self._apply(lane, node, model)
        self.recent.append(model)
        self.demand[model] = self.demand.get(model, 0) + 1
        if len(self.recent) > DEMAND_WINDOW:
            self.demand[self.recent.popleft()] -= 1
        if self.demand[model] == 1:
            self.rehome(self.homes)

    def node_for(self, model, route_key, lane=None):
        base, snapshot = self.base, self.snapshot
        elapsed = max(0.0, self.clock() - snapshot.get("measured_at", snapshot["at"]))
        drain = base["drain_s"]

        def now(counts, sent):
            return {n: max(0.0, load + sent.get(n, 0)
                           - (elapsed / drain[n] if drain.get(n) else 0))
                    for n, load in counts.items()}
        placed = (model, base["ring"])
        where = (self.warm, drain, base["cold_s"].get(model, base["cold_default_s"]),
                 None if route_key else self.homes.get(model),
                 f"{model}/{route_key}" if route_key else None)
        if lane == "fast":
            return old_fast_home(*placed, now(base["loads"], self.node_sent),
                                 now(base["fast"], self.fast_sent), self.epsilon, *where)
        return old_home(*placed, now(base["loads"], self.node_sent), self.epsilon, *where)


# --- random fleets ---------------------------------------------------------------------
MODELS = [f"m{i}" for i in range(40)]
LANES3 = ("fast", "standard", "relaxed")


def random_worker(rng, models=MODELS):
    slots = rng.randint(1, 4)  # a budget of as many MB, models of 1 MB: as many slots
    warm = list(dict.fromkeys(rng.choices(models, k=rng.randint(0, slots))))
    return {"alive": rng.random() > 0.05, "sick": "disk" if rng.random() < 0.03 else None,
            "warm_models": warm, "memory_mb": slots, "model_mb": {m: 1 for m in models[:2]},
            "loading_models": [rng.choice(models)] if rng.random() < 0.1 else [],
            "in_flight": {lane: rng.randint(0, 2) for lane in LANES3},
            "queued": rng.choice((0, 0, 1, 3, 7)), "concurrency": rng.choice((1, 1, 2)),
            "queued_fast": rng.choice((0, 0, 0, 1, 2)),
            "service_ms": {lane: rng.choice((0, 50.0, 100.0, 1000.0, rng.uniform(20, 5000)))
                           for lane in LANES3 if rng.random() < 0.7},
            "load_ms": {m: rng.uniform(100, 9000) for m in rng.sample(models, 3)}}


def random_snapshot(rng, workers=50, at=1000.0):
    return {"at": at, "measured_at": at - rng.uniform(0, 0.3),
            "lanes": {lane: {"depth": rng.randint(0, 20), "expected_wait_s": rng.uniform(0, 9)}
                      for lane in LANES3},
            "policy": {"fast": {"overloaded": rng.random() < 0.2, "calm_samples": 0},
                       "standard": {"overloaded": rng.random() < 0.2, "calm_samples": 0}},
            "workers": {f"gpu{i % 4}@h{i // 4}": random_worker(rng) for i in range(workers)},
            "exhausted": ["payer"] if rng.random() < 0.3 else [], "levels": {"heavy": 2}}


def evolve(rng, snapshot, at):
    """The next heartbeat: new loads; now and then a model loaded, an LRU shuffle, a
    worker gone, sick or back, one joining."""
    workers = {}
    for host, worker in snapshot["workers"].items():
        worker = {**worker, "queued": rng.choice((0, 0, 1, 2, 5)),
                  "queued_fast": rng.choice((0, 0, 0, 1)),
                  "in_flight": {lane: rng.randint(0, 2) for lane in LANES3}}
        roll = rng.random()
        if roll < 0.05:
            worker["warm_models"] = [*worker["warm_models"][1:], rng.choice(MODELS)]
        elif roll < 0.15 and len(worker["warm_models"]) > 1:
            worker["warm_models"] = worker["warm_models"][1:] + worker["warm_models"][:1]
        elif roll < 0.17:
            worker["alive"] = not worker["alive"]
        elif roll < 0.18:
            worker["sick"] = None if worker["sick"] else "disk"
        workers[host] = worker
    if rng.random() < 0.1:
        workers[f"gpu0@new{rng.randrange(10**6)}"] = random_worker(rng)
    return {**snapshot, "at": at, "measured_at": at - rng.uniform(0, 0.3), "workers": workers}


# --- the split ---------------------------------------------------------------------------
def unsplit(compact, members):
    """Per serving host, what routing knows of it: ``load``, ``fast``, ``drain_s`` (None: not
    measured), ``budget_mb`` and ``warm`` (in the worker's order)."""
    hosts = members["hosts"]
    loads, fast, _ = unpack_work(compact, len(hosts))
    assert compact["slice"] == [0, len(hosts)]  # a small fleet's slow figures come whole
    drains = unpack_u8(compact["drain"], len(hosts))
    order = slice_ranks(compact)
    return {host: {"load": loads[i], "fast": fast[i], "drain_s": DRAIN_S[drains[i]],
                   "budget_mb": members["budget_mb"][i],
                   "warm": in_order(members["warm"][i], order[i])}
            for i, host in enumerate(hosts)}


def test_split_round_trips_what_routing_reads():
    rng = random.Random(7)
    for _ in range(20):
        snapshot = random_snapshot(rng)
        snapshot["workers"]["gpu0@busy"] = {**random_worker(rng), "alive": True, "sick": None,
                                            "queued": 70_000}
        compact, members = split(json.loads(json.dumps(snapshot)))
        routed = unsplit(json.loads(json.dumps(compact)), json.loads(json.dumps(members)))
        serving_hosts = sorted(h for h, w in snapshot["workers"].items() if serving(w))
        assert members["hosts"] == list(routed) == serving_hosts
        for host in serving_hosts:
            worker, seen = snapshot["workers"][host], routed[host]
            assert seen["budget_mb"] == worker["memory_mb"]
            assert seen["warm"] == tuple(dict.fromkeys(worker["warm_models"]
                                                       + worker["loading_models"]))
            load = sum(worker["in_flight"].values()) + worker["queued"]
            assert seen["load"] == min(load, U16_MAX)
            running = max(worker["in_flight"]["fast"], 1 if worker["loading_models"] else 0)
            assert seen["fast"] == running + worker["queued_fast"]
            samples = [ms for ms in worker["service_ms"].values() if ms]
            if not samples:
                assert seen["drain_s"] is None
            else:
                drain = sum(samples) / len(samples) / 1000 / worker["concurrency"]
                assert seen["drain_s"] == pytest.approx(drain, rel=0.03)
        for key in ("at", "measured_at", "lanes", "policy", "exhausted", "levels"):
            assert compact[key] == snapshot[key]
        assert "workers" not in compact and compact["members"] == members["version"]


def test_the_version_names_the_membership_and_nothing_that_changes_per_heartbeat():
    rng = random.Random(3)
    snapshot = random_snapshot(rng)
    version = split(snapshot)[1]["version"]
    assert len(version) == 16 and int(version, 16) >= 0
    same = {**snapshot, "at": 1001.0, "workers": {  # new loads, times, LRU orders
        h: {**w, "queued": 3, "warm_models": w["warm_models"][::-1],
            "service_ms": {"fast": 1.0}} for h, w in snapshot["workers"].items()}}
    assert split(same)[1]["version"] == version
    assert split(same)[0]["order"] != split(snapshot)[0]["order"]  # the order travels
    host = next(h for h, w in snapshot["workers"].items() if serving(w))
    for change in ({"warm_models": ["brand-new"]}, {"memory_mb": 9}, {"alive": False},
                   {"model_mb": {"m0": 5}},
                   {"sick": "disk"}, {"loading_models": ["another"]}):
        changed = {**snapshot, "workers": {**snapshot["workers"],
                                           host: {**snapshot["workers"][host], **change}}}
        assert split(changed)[1]["version"] != version, change
    joined = {**snapshot, "workers": {**snapshot["workers"], "gpu9@x": random_worker(rng)}}
    joined["workers"]["gpu9@x"].update(alive=True, sick=None)
    assert split(joined)[1]["version"] != version


def test_orders_and_drain_codes():
    rng = random.Random(5)
    for size in range(0, 10):
        models = sorted(f"m{i}" for i in range(size))
        for _ in range(20):
            shuffled = rng.sample(models, size)
            assert in_order(models, rank_of(models, shuffled)) == tuple(shuffled)
    nine = [f"m{i}" for i in range(9)]
    snapshot = {"at": 1.0, "workers": {"w": {"alive": True, "warm_models": nine[::-1],
                                             "memory_mb": 9}}}
    compact, members = split(snapshot)
    assert compact["order_over"] == {"0": rank_of(sorted(nine), nine[::-1])}
    assert unsplit(compact, members)["w"]["warm"] == tuple(nine[::-1])
    assert drain_code(None) == 0 and DRAIN_S[0] is None
    for seconds in (0.1, 1.0, 10.0):
        assert DRAIN_S[drain_code(seconds)] == seconds  # exact at the decades
    assert DRAIN_S[drain_code(1e-9)] == DRAIN_S[1] and DRAIN_S[drain_code(1e9)] == DRAIN_S[255]


def test_the_compact_snapshot_of_1000_workers_fits_in_8_kb():
    compact, members = split(fleet_snapshot(1000))
    assert len(members["hosts"]) == 1000
    assert len(json.dumps(compact, separators=(",", ":"))) <= 8 * 1024
    assert len(json.dumps(compact)) <= 8 * 1024


# --- the pieces against the reference ----------------------------------------------------
def random_placement(rng):
    nodes = [f"w{i}" for i in range(rng.randint(1, 40))]
    model = rng.choice(("sd", "llm", "tiny"))
    share = rng.random()
    warm = {n: (model,) if rng.random() < share else ("other",) for n in nodes}
    warm["not-on-ring"] = (model,)
    loads = {n: rng.choice((0, 1, 2, 3, 5, 9, rng.uniform(0, 6))) for n in nodes}
    drain = {n: rng.choice((0.0, 0.1, rng.uniform(0.01, 3))) for n in nodes} \
        if rng.random() < 0.8 else {}
    first = rng.choice((None, "gone", *nodes))
    key = rng.choice((None, f"{model}/lora-{rng.randrange(9)}"))
    return (model, nodes, loads, rng.choice((0.0, 0.25, 1.0)), warm, drain,
            rng.choice((0.0, 0.5, 5.0)), first, key)


def test_home_chooses_as_before():
    rng = random.Random(11)
    for _ in range(3000):
        model, nodes, loads, epsilon, warm, drain, cold_s, first, key = random_placement(rng)
        reference = old_home(model, ring_of(tuple(nodes)), loads, epsilon, warm, drain, cold_s,
                             first, key)
        hash_ring = ring(nodes)
        held = frozenset(n for n in nodes if model in warm[n])
        fast = home(model, hash_ring, loads, epsilon, warm, drain, cold_s, first, key,
                    holders={model: held}, load_sum=sum(loads.values()))
        assert fast == home(model, hash_ring, loads, epsilon, warm, drain, cold_s, first, key)
        holders = ([first] if first in held else []) + \
            [n for n in old_ring_order(key or model, *ring_of(tuple(nodes)), len(nodes))
             if n in held and n != first]
        if len(holders) <= DELAY_HOLDERS:
            assert fast == reference
        elif fast != reference:  # only where the wait is weighed, over the first holders
            first_few = {n: warm[n] if n in holders[:DELAY_HOLDERS] else () for n in nodes}
            assert fast == old_home(model, ring_of(tuple(nodes)), loads, epsilon, first_few, drain,
                                    cold_s, first, key)


def test_homes_are_assigned_as_before():
    rng = random.Random(12)
    for _ in range(300):
        nodes = [f"w{i}" for i in range(rng.randint(1, 30))]
        models = [f"m{i}" for i in range(rng.randint(0, 60))]
        rng.shuffle(models)
        slots = {n: rng.randint(0, 3) for n in nodes if rng.random() < 0.9}
        previous = {m: rng.choice([*nodes, "gone"]) for m in models if rng.random() < 0.5}
        assert assign_homes(models, ring(nodes), slots, previous) == \
            old_assign_homes(models, old_ring(nodes), slots, previous)


def test_a_derived_ring_is_the_ring():
    rng = random.Random(13)
    nodes = {f"w{i}" for i in range(80)}
    current = ring(nodes)
    assert (tuple(current[0]), current[1]) == old_ring(nodes)
    for _ in range(30):
        nodes -= set(rng.sample(sorted(nodes), rng.randint(0, 4)))
        nodes |= {f"n{rng.randrange(10**6)}" for _ in range(rng.randint(0, 4))}
        current = derive(current, nodes)
        assert (tuple(current[0]), current[1]) == old_ring(nodes)
    assert derive(current, set(nodes)) is current


def test_a_ring_remembers_where_each_walk_starts():
    """A ring's remembered start of a key's walk is the bisection of its points."""
    current = ring({f"w{i}" for i in range(50)})
    for key in [f"m{i}" for i in range(40)] * 2:
        assert hashring._start_of(current, key) == bisect.bisect(current[0], hashring.point(key))


def test_holders_in_ring_order_stay_right_as_the_set_changes():
    rng = random.Random(14)
    hosts = [f"w{i}" for i in range(200)]
    hash_ring, held = ring(hosts), frozenset(rng.sample(hosts, 80))
    for _ in range(200):
        gone = set(rng.sample(sorted(held), min(len(held), rng.choice((0, 1, 2, 30)))))
        came = set(rng.sample(hosts, rng.choice((0, 1, 3, 25))))
        toggled = frozenset(gone | (came - held))
        held = changed_set(held, toggled) if rng.random() < 0.5 else held ^ toggled
        key = rng.choice(("sd", "sd/lora-1", "llm"))
        assert list(in_ring_order(held, key)) == [n for n in hash_ring.walk(key) if n in held]


def test_holders_known_busy_are_skipped_only_while_they_surely_are():
    """The run of busy holders a view remembers (per snapshot) is skipped by later jobs
    only while it must still be busy: the same or a patched order (up to the patch),
    no view with fewer of this process's sends, no higher cap; each busy holder is read
    again once time may have drained it. Each answer is the one of a view that
    remembers nothing."""
    rng = random.Random(21)
    hosts = [f"w{i}" for i in range(60)]
    index = {host: i for i, host in enumerate(hosts)}
    for trial in range(40):
        measured = [rng.choice((0, 1, 3, 6, 9, 12)) for _ in hosts]
        drain = [rng.choice((0.05, 0.2, 1.0, 4.0)) for _ in hosts] if trial % 4 else ()
        busy, key = {}, f"busy-{trial}"
        held, sent, t, seen = frozenset(rng.sample(hosts, 40)), {}, 0.0, []
        for _ in range(80):
            roll = rng.random()
            if roll < 0.3:
                toggled = frozenset(rng.sample(hosts, rng.choice((1, 1, 2, 20))))
                held = changed_set(held, toggled) if rng.random() < 0.7 else held ^ toggled
            elif roll < 0.7:
                node = rng.choice(hosts)
                sent = {**sent, node: sent.get(node, 0) + rng.choice((1, 5))}
            else:
                t += rng.choice((0.0, 0.02, 0.1, 0.3, 1.0))
            seen.append((sent, len(seen), t))
            sent_then, sends, t_then = seen[-1] if rng.random() < 0.8 else rng.choice(seen)
            order, cap = in_ring_order(held, key), rng.choice((2, 3, 5, 8))
            remembering = Loads(index, measured, drain, sent_then, t_then, sends, busy)
            fresh = Loads(index, measured, drain, sent_then, t_then, sends)
            assert remembering.first_below(order, cap, key) == \
                fresh.first_below(order, cap, key)


@pytest.mark.parametrize("kind", [DrainingSum, Draining])
def test_the_draining_sum_is_the_sum_of_each_estimate(kind):
    rng = random.Random(15)
    for _ in range(50):
        x = [rng.choice((0, 0, 1, 2, 5, 30)) for _ in range(40)]
        r = [rng.choice((0.0, 0.5, 1.0, 10.0)) for _ in range(40)]
        total, t = kind(x, r), 0.0
        for _ in range(60):
            if rng.random() < 0.5:
                i = rng.randrange(40)
                x[i] += 1
                total.add(i)
            t += rng.choice((0.0, 0.01, 0.3, 2.0))
            assert total.at(t) == pytest.approx(sum(max(0.0, a - t * b) for a, b in zip(x, r)),
                                                abs=1e-9)


# --- the router: compact snapshots, full snapshots, and the old router ---------------------
DEPTHS = {"fast": 40, "standard": 45, "relaxed": 60}


class Beat:
    """Writes each heartbeat both ways: the full snapshot, and the two parts."""

    def __init__(self):
        self.full = self.compact = None
        self.members, self.reads, self.fail = {}, [], None

    def write(self, snapshot):
        compact, members = split(snapshot)
        self.full, self.compact = json.dumps(snapshot), json.dumps(compact)
        self.members[members["version"]] = json.dumps(members)

    def fetch_members(self, version):
        self.reads.append(version)
        if self.fail == "raise":
            raise ConnectionError("redis down")
        return None if self.fail == "missing" else self.members.get(version)


def caches(beat, clock):
    full = SnapshotCache(lambda: beat.full, refresh_s=0.5, stale_s=3.0, max_depth=DEPTHS,
                         clock=clock)
    compact = SnapshotCache(lambda: beat.compact, refresh_s=0.5, stale_s=3.0,
                            max_depth=DEPTHS, clock=clock, fetch_members=beat.fetch_members)
    for cache in (full, compact):
        cache._thread = object()  # refreshed by hand
    return full, compact


@pytest.mark.parametrize("seed", [1, 2])
def test_compact_snapshots_route_as_full_ones_and_as_before(seed):
    rng, now, beat = random.Random(seed), [1000.0], Beat()
    clock = lambda: now[0]  # noqa: E731
    full, compact = caches(beat, clock)
    old = OldRouter(clock, stale_s=3.0)
    snapshot, versions, decided = random_snapshot(rng), [], 0
    for _ in range(40):
        beat.write(snapshot)
        versions.append(json.loads(beat.compact)["members"])
        full.refresh(), compact.refresh(), old.apply(json.loads(beat.full))
        for _ in range(50):
            now[0] += rng.choice((0.0, 0.002, 0.01, 0.05))
            model = rng.choice(MODELS[:12]) if rng.random() < 0.8 else rng.choice(MODELS)
            key = f"lora-{rng.randrange(6)}" if rng.random() < 0.2 else None
            tier, account = rng.choice(LANES3), rng.choice(("a", "payer", "heavy"))
            routes = [decide(tier, account, True, cache.view(), model, route_key=key)
                      for cache in (full, compact)]
            assert routes[0] == routes[1]
            if routes[0] is None:
                continue
            assert routes[0].node == old.node_for(model, key, routes[0].lane)
            decided += 1
            if rng.random() < 0.9:  # else refused at the publish: not sent
                node = routes[0].node if rng.random() < 0.95 else None
                for cache in (full, compact):
                    cache.note_sent(routes[0].lane, node, model)
                old.note_sent(routes[0].lane, node, model)
        now[0] += 0.3
        snapshot = evolve(rng, snapshot, now[0])
    assert decided > 1500
    changes = [v for i, v in enumerate(versions) if i == 0 or v != versions[i - 1]]
    assert beat.reads == changes and len(changes) > 5  # the members read on change only


def test_a_members_document_that_cannot_be_read_keeps_the_last_copy():
    rng, now, beat = random.Random(4), [1000.0], Beat()
    _, cache = caches(beat, lambda: now[0])
    snapshot = random_snapshot(rng)
    beat.write(snapshot)
    cache.refresh()
    held = cache.view()
    host = next(h for h, w in snapshot["workers"].items() if serving(w))
    for fail in ("raise", "missing"):
        now[0] += 0.5
        snapshot = {**snapshot, "at": now[0], "workers": {
            **snapshot["workers"], host: {**snapshot["workers"][host], "alive": False}}}
        beat.write(snapshot)
        beat.fail = fail
        cache.refresh()
        view = cache.view()
        assert view.at == held.at and set(view.ring[1]) == set(held.ring[1])
    beat.fail = None
    cache.refresh()  # tried again: read now
    assert cache.view().at == now[0] and host not in cache.view().ring[1]
    assert len(beat.reads) == 4 and len(set(beat.reads[1:])) == 1  # the first, then one


def test_a_membership_change_that_keeps_the_hosts_keeps_the_ring():
    rng = random.Random(6)
    snapshot = random_snapshot(rng)
    first = build_fleet(split(snapshot)[1])
    host = first.hosts[0]
    loaded = {**snapshot, "workers": {**snapshot["workers"], host: {
        **snapshot["workers"][host], "warm_models": ["brand-new"]}}}
    second = build_fleet(split(loaded)[1], first)
    assert second.version != first.version and second.ring is first.ring
    assert second.holders["brand-new"] == {host}
    unchanged = [m for m in first.holders if first.holders[m] == second.holders.get(m)]
    assert unchanged and all(second.holders[m] is first.holders[m] for m in unchanged)


def test_a_fleet_derived_from_the_last_is_the_fleet_built_afresh():
    """Members versions one after another (models loaded, workers joining, leaving,
    sickening): each fleet derived from the last, and the figures carried from the
    last snapshot, are those of one built from nothing."""
    rng = random.Random(9)
    snapshot, fleet, held = random_snapshot(rng, workers=30), None, None
    for step in range(40):
        snapshot = evolve(rng, snapshot, 1000.0 + step)
        compact, members = split(snapshot)
        fresh = build_fleet(members)
        fleet = build_fleet(members, fleet)
        assert (fleet.hosts, fleet.warm, fleet.budget_mb, fleet.capacity, dict(fleet.index)) == \
            (fresh.hosts, fresh.warm, fresh.budget_mb, fresh.capacity, dict(fresh.index))
        assert fleet.holders == fresh.holders and tuple(map(tuple, fleet.ring)) == \
            tuple(map(tuple, fresh.ring)) and fleet.ring.nodes == frozenset(fresh.hosts)
        carried = measure(compact, fleet, held)
        by_name = None if held is None else measure(compact, fresh, held)
        assert by_name is None or (carried.codes, carried.ranks) == (by_name.codes, by_name.ranks)
        held = carried


def test_a_router_carries_the_slow_figures_of_each_slice(monkeypatch):
    """Past ``SLICE_HOSTS`` a snapshot carries the drain and order of one slice of the
    hosts in turn: a router that applied each slice holds what a whole one gives, and
    keeps them, by host, through a new membership."""
    rng = random.Random(8)
    snapshot = random_snapshot(rng, workers=40)
    whole_compact, members = split(snapshot)
    fleet = build_fleet(members)
    whole = measure(whole_compact, fleet)
    monkeypatch.setattr(compact, "SLICE_HOSTS", 8)
    held, seen = None, set()
    for second in range(-(-len(fleet.hosts) // 8)):
        sliced, _ = split({**snapshot, "at": 1000.0 + second})
        start, stop = sliced["slice"]
        assert stop - start <= 8 and len(json.dumps(sliced)) < len(json.dumps(whole_compact))
        seen.update(range(start, stop))
        held = measure(sliced, fleet, held)
        assert held.loads == whole.loads and held.fast == whole.fast
    assert seen == set(range(len(fleet.hosts)))
    assert (held.codes, held.ranks, held.drain_s, held.rates) == \
        (whole.codes, whole.ranks, whole.drain_s, whole.rates)
    host = next(h for h in fleet.hosts if len(members["warm"][fleet.index[h]]) > 1)
    loaded = {**snapshot, "at": 2000.0, "workers": {**snapshot["workers"], host: {
        **snapshot["workers"][host], "warm_models": ["brand-new"], "loading_models": []}}}
    sliced, moved = split(loaded)
    after = measure(sliced, build_fleet(moved, fleet), held)
    start, stop = sliced["slice"]
    for i, name in enumerate(after.fleet.hosts):
        was = fleet.index[name]
        assert after.codes[i] == held.codes[was]
        if name != host and not start <= i < stop:
            assert after.ranks[i] == held.ranks[was]
    assert after.ranks[after.fleet.index[host]] == 0  # a new warm set: no old order
