"""The split kept from round to round (routing.splitter): told which hosts changed, it
gives what ``split`` gives for the same snapshot, byte for byte, round after round."""
from __future__ import annotations

import copy
import json
import random

import pytest

from routing import compact
from routing.compact import split
from routing.splitter import Splitter
from tests.harness.fleet import fleet_snapshot

MODELS = [f"m{i}" for i in range(12)]


def _work(rng, worker):
    worker["queued"] = rng.choice((0, 1, 2, 40))  # 40: past a byte (work_over)
    worker["queued_fast"] = rng.choice((0, 0, 1, 5))
    worker["in_flight"] = {"fast": rng.randint(0, 1), "standard": rng.randint(0, 2)}


def _drain(rng, worker):
    worker["service_ms"] = {"standard": rng.choice((0.0, 80.0, 900.0, 12_000.0))}


def _reorder(rng, worker):
    rng.shuffle(worker["warm_models"])  # the order travels, the version stays


def _load(rng, worker):
    worker["loading_models"] = rng.sample(MODELS, rng.randint(0, 2))


def _warm(rng, worker):
    worker["warm_models"] = rng.sample(MODELS, rng.randint(0, 7))  # 7: ranks past 255


def _sizes(rng, worker):
    worker["model_mb"] = {model: rng.choice((900.5, 2000, 24_000)) for model in
                          rng.sample(MODELS, 3)}
    worker["memory_mb"] = rng.choice((24_000, 80_000))


def _load_times(rng, worker):
    worker["load_ms"] = {model: rng.uniform(100, 9000) for model in rng.sample(MODELS, 2)}


def _health(rng, worker):
    key = rng.choice(("alive", "sick", "stuck"))
    worker[key] = {"alive": not worker.get("alive"), "sick": rng.choice((None, "oom")),
                   "stuck": rng.choice((False, True))}[key]


CHANGES = (_work, _work, _drain, _reorder, _load, _warm, _sizes, _load_times, _health)


def _round(rng, workers, spare):
    """Change a few hosts of ``workers`` (one may join from ``spare`` or leave); which."""
    changed = set()
    for host in rng.sample(sorted(workers), min(len(workers), rng.randint(0, 6))):
        rng.choice(CHANGES)(rng, workers[host])
        changed.add(host)
    if rng.random() < 0.2 and spare:
        host, record = spare.popitem()
        workers[host] = record
        changed.add(host)
    if rng.random() < 0.15:
        host = rng.choice(sorted(workers))
        del workers[host]
        changed.add(host)
    return changed


def _same(ours, theirs):
    assert json.dumps(ours[0]) == json.dumps(theirs[0])
    assert json.dumps(ours[1]) == json.dumps(theirs[1])


@pytest.mark.parametrize("seed", range(4))
def test_a_kept_split_is_the_split_of_each_round(monkeypatch, seed):
    monkeypatch.setattr(compact, "SLICE_HOSTS", 16)  # the slice turns over the hosts
    rng = random.Random(seed)
    snapshot = fleet_snapshot(40, seed)
    spare = fleet_snapshot(10, seed + 100)["workers"]
    spare = {f"new-{host}": record for host, record in spare.items()}
    splitter, workers = Splitter(), snapshot["workers"]
    _same(splitter.split(snapshot, None), split(snapshot))
    for number in range(150):
        snapshot["at"] += 1
        changed = _round(rng, workers, spare)
        if number % 50 == 49:  # the record read whole: everything anew
            changed = None
        _same(splitter.split(snapshot, changed), split(snapshot))


def test_a_change_it_was_not_told_of_or_another_record_starts_it_over():
    snapshot = fleet_snapshot(20)
    splitter = Splitter()
    splitter.split(snapshot, None)
    del snapshot["workers"][sorted(snapshot["workers"])[0]]  # gone, unnamed
    _same(splitter.split(snapshot, set()), split(snapshot))
    other = copy.deepcopy(snapshot)
    other["workers"][sorted(other["workers"])[0]]["loading_models"] = ["m1"]
    _same(splitter.split(other, set()), split(other))


def test_a_round_with_no_change_costs_no_new_version():
    snapshot = fleet_snapshot(30)
    splitter = Splitter()
    first = splitter.split(snapshot, None)
    snapshot["at"] += 1
    again = splitter.split(snapshot, set())
    assert again[1] is first[1] and again[0]["members"] == first[0]["members"]
