"""A fresh process routes its first burst from beat's snapshot, on a real cluster (two
workers with room for two models each, beat, three models of 2 MB that take a second to
load): every job goes to the worker that holds its model warm, so no model is loaded
twice."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from collections import defaultdict
from itertools import chain, zip_longest
from pathlib import Path

import pytest
from conftest import wait_until

pytestmark = pytest.mark.cluster

ROOT = Path(__file__).resolve().parent.parent
MODELS = ("slow-0", "slow-1", "slow-2")
JOBS = 60
ENV = {"GPULANES_MODELS": ",".join([os.environ["GPULANES_MODELS"],
                                    *(f"{m}=tests.slow_models:Slow" for m in MODELS)]),
       "GPULANES_MODEL_MEMORY_MB": "4"}
#: A process of its own: submits the models named in argv all at once, then prints
#: (model, worker, cold start) of each job.
SUBMIT = """
import json, sys
from tasks import submit
jobs = [submit(model=model, n=i) for i, model in enumerate(json.loads(sys.argv[1]))]
print(json.dumps([[out["model"], out["worker"], out["cold_start"]]
                  for out in (job.get(timeout=60) for job in jobs)]))
"""


@pytest.fixture(scope="module")
def cluster(cluster_factory):
    return cluster_factory(workers=2, beat=True, env=ENV)


def _submit_from_new_process(models: list[str]) -> list[tuple[str, str, bool]]:
    done = subprocess.run([sys.executable, "-c", SUBMIT, json.dumps(models)],
                          env={**os.environ, **ENV}, cwd=ROOT, capture_output=True,
                          text=True, timeout=90)
    assert done.returncode == 0, done.stderr[-3000:]
    return [tuple(row) for row in json.loads(done.stdout.splitlines()[-1])]


def _warm_in_snapshot(client) -> dict[str, list[str]]:
    """Each worker's warm models in beat's latest snapshot ({} before there is one)."""
    from tasks.broker.keys import SNAPSHOT_KEY, members_key

    raw = client.get(SNAPSHOT_KEY)
    members = raw and client.get(members_key(json.loads(raw)["members"]))
    members = json.loads(members) if members else {"hosts": [], "warm": []}
    return dict(zip(members["hosts"], members["warm"]))


def _burst(holder: dict[str, str]) -> list[str]:
    """``JOBS`` jobs, half for each worker's models, mixed: a burst the workers can take
    as the models are placed (no worker over its bounded load)."""
    per_host = defaultdict(list)
    for model, host in sorted(holder.items()):
        per_host[host].append(model)
    streams = [[models[i % len(models)] for i in range(JOBS // len(per_host))]
               for models in per_host.values()]
    return [model for pair in zip_longest(*streams) for model in pair if model]


@pytest.mark.timeout(120)
def test_a_fresh_processes_first_burst_loads_no_model_twice(cluster, clean_redis):
    wait_until(lambda: len(_warm_in_snapshot(clean_redis)) == 2, timeout_s=30,
               what="beat's snapshot of both workers")
    warm_up = _submit_from_new_process(list(MODELS))  # each model's first load
    holder = {model: host for model, host, _ in warm_up}
    assert sorted(holder) == sorted(MODELS) and len(set(holder.values())) == 2, warm_up
    wait_until(lambda: set(MODELS) <= set(chain(*_warm_in_snapshot(clean_redis).values())),
               timeout_s=30, what="beat's snapshot of the warm models")
    outs = _submit_from_new_process(_burst(holder))
    cold = [(model, host) for model, host, cold_start in outs if cold_start]
    ran_on = defaultdict(set)
    for model, host, _ in outs:
        ran_on[model].add(host)
    assert len(outs) == JOBS and len(cold) <= len(MODELS), cold
    assert all(ran_on[model] == {holder[model]} for model in MODELS), dict(ran_on)
