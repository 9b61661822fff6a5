"""Cells: pools on Redis instances of their own. Two real cells (a Redis, a worker and
beat each), one submitting process that knows both."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import uuid
from pathlib import Path

import pytest
from conftest import STATE_DIR, wait_until

from gpu_worker.redis_server import EmbeddedRedis
from tasks.broker import cell, cells
from tasks.errors import ConfigError
from tasks.settings import load, override
from tasks.settings_cells import parse_cells

#: Each cell's pool, and the model its worker holds warm.
WARM = {"cell-a": "echo", "cell-b": "typed"}


def test_the_broker_url_names_cells_and_each_pool_uses_its_own():
    spec = "gpu-a=redis://r1:6379/0, gpu-b=sentinel://s1:26379;sentinel://s2:26379"
    assert parse_cells(spec) == {"gpu-a": "redis://r1:6379/0",
                                 "gpu-b": "sentinel://s1:26379;sentinel://s2:26379"}
    assert parse_cells("redis://h:6379/0?socket_timeout=3") == {}  # one Redis
    mine = load(broker_url="gpu-a=redis://r1/0 gpu-b=redis://r2/0", pool="gpu-b")
    assert mine.broker_url == mine.result_backend == "redis://r2/0"
    assert list(mine.cells) == ["gpu-a", "gpu-b"]
    assert load(broker_url="gpu-a=redis://r1/0", pool="other").broker_url == "redis://r1/0"
    for bad, says in (("gpu-a=redis://r1/0, redis://r2/0", "not a cell"),
                      ("GPU=redis://r1/0", "not a cell"),
                      ("a=redis://r1/0 a=redis://r2/0", "named twice")):
        with pytest.raises(ConfigError, match=says) as refused:
            load(broker_url=bad)
        assert refused.value.variable == "GPULANES_BROKER_URL"
    with pytest.raises(ConfigError) as refused:
        load(broker_url="a=redis://r1/0", result_backend="redis://r3/0")
    assert refused.value.variable == "GPULANES_RESULT_BACKEND"


def test_a_job_id_is_a_uuid_that_names_its_cell():
    with override(broker_url=", ".join(f"c{i}=redis://r{i}/0" for i in range(40))):
        for name in ("c0", "c17", "c39"):
            job_id = cell.new_job_id(name)
            assert str(uuid.UUID(job_id)) == job_id and uuid.UUID(job_id).version == 4
            assert cell.named_by(job_id) == name
        assert cell.named_by(str(uuid.UUID(int=0xFF))) is None  # no cell 255
    assert cell.named_by(str(uuid.uuid4())) is None  # no cells


@pytest.fixture(scope="module")
def two_cells(redis_server, app):
    """Two cells, each its own Redis, one worker and beat; the test process knows both."""
    from tasks.dev.cluster import LocalCluster

    assert app.conf.broker_url  # the session app's settings read now, not under the cells'

    folders = {name: Path(tempfile.mkdtemp(prefix=f"gl-{name}-", dir="/tmp")) for name in WARM}
    spec = ", ".join(f"{name}={EmbeddedRedis(folder).url}" for name, folder in folders.items())
    started = []
    with override(broker_url=spec):
        try:
            for name, folder in folders.items():
                cluster = LocalCluster(folder, workers=1, device="cpu", beat=True, env={
                    "GPULANES_BROKER_URL": spec, "GPULANES_POOL": name,
                    "GPULANES_WARM_MODELS": WARM[name]},
                    log_dir=STATE_DIR / "logs" / f"test_cells-{name}")
                started.append(cluster)
                cluster.start(cells.app_of(name), timeout_s=120, fresh=True)
            yield {name: cluster for name, cluster in zip(folders, started)}
        finally:
            for cluster in started:
                cluster.stop()


def test_each_job_goes_to_the_cell_of_its_model_and_its_result_comes_from_there(
        two_cells, clean_redis):
    from tasks import result, submit

    def warm_in(name: str, model: str) -> bool:
        with cell.within(name):
            from tasks.broker.view import snapshot_cache
            view = snapshot_cache().members()
        return view is not None and bool(view.holders.get(model))

    wait_until(lambda: all(warm_in(name, model) for name, model in WARM.items()), 60,
               "each cell's snapshot to show its warm model")
    jobs = {name: [submit(model=model, tier=tier, **({"text": tier} if model == "echo" else
                                                      {"count": i}))
                   for i, tier in enumerate(("fast", "standard", "relaxed"))]
            for name, model in WARM.items()}
    for name, sent in jobs.items():
        client = two_cells[name].redis.client()
        for job in sent:
            assert cell.named_by(job.id) == name
            done = job.get(timeout=60)
            assert done["model"] == WARM[name] and done["attempts"] == 1
            assert result(job.id).get(timeout=5) == done  # by its id alone
            assert client.exists(f"celery-task-meta-{job.id}")  # its result: in its cell
            other = two_cells[next(n for n in WARM if n != name)].redis.client()
            assert not other.exists(f"celery-task-meta-{job.id}")
    assert not clean_redis.keys("celery-task-meta-*")  # the submitter's own Redis: none
    shown = _lanes(two_cells, "job", jobs["cell-b"][0].id, "--json")  # the operator's CLI
    assert json.loads(shown)["state"] == "SUCCESS", shown


def _lanes(two_cells, *args: str) -> str:
    """``celery -A tasks lanes ARGS`` of a process that knows both cells."""
    spec = ", ".join(f"{name}={cluster.url}" for name, cluster in two_cells.items())
    proc = subprocess.run([sys.executable, "-m", "celery", "-A", "tasks", "lanes", *args],
                          capture_output=True, text=True, timeout=60,
                          env={**os.environ, "GPULANES_BROKER_URL": spec})
    assert proc.returncode == 0, proc.stderr
    return proc.stdout


def test_a_cell_down_leaves_the_other_serving(two_cells):
    """One cell's Redis stopped: its jobs are refused at submit
    (``BrokerUnavailable``), the other cell's still run."""
    import signal

    from tasks import submit
    from tasks.errors import BrokerUnavailable

    down = two_cells["cell-b"].redis
    os.kill(down.process.pid, signal.SIGSTOP)
    try:
        with pytest.raises(BrokerUnavailable):
            submit(model="typed", count=1)
        assert submit(model="echo", text="still here").get(timeout=60)["model"] == "echo"
    finally:
        os.kill(down.process.pid, signal.SIGCONT)
    assert submit(model="typed", count=1).get(timeout=60)["model"] == "typed"


def test_parts_of_an_account_spread_by_use_and_keep_their_sum():
    from beat.fastsplit import parts_by_use

    moved = parts_by_use({"a": -2.0, "b": 50.0, "c": 0.0}, {"a": 30.0})
    assert sum(moved.values()) == pytest.approx(48.0) and moved["a"] > 47.9
    assert parts_by_use({"a": 4.0, "b": 2.0}, {}) == {"a": 3.0, "b": 3.0}  # unused: equal
    assert parts_by_use({"a": -1.0, "b": 0.0}, {"a": 5.0}) == {"a": -1.0, "b": 0.0}
    spent = parts_by_use({"a": -3.0, "b": 1.0}, {"a": 1.0, "b": 1.0})  # less than nothing
    assert all(part <= 0 for part in spent.values()) and sum(spent.values()) == -2.0


def test_beat_moves_an_accounts_seconds_to_the_cell_where_it_ran_out(tmp_path):
    """Two Redis: an account spent in one cell, with seconds in the other, gets them
    where it spends, its sum kept and its spent mark dropped; a plan's account and one
    spent everywhere stay as they are."""
    import time

    from beat.fastsplit import spread
    from tasks.broker.keys import FAST_BALANCE_KEY, FAST_EXHAUSTED_KEY, FAST_PERIOD_KEY
    from tasks.broker.keys import USAGE_BUCKET_S, usage_key

    servers = [EmbeddedRedis(tmp_path / name).start() for name in ("a", "b")]
    try:
        a, b = (server.client() for server in servers)
        now = time.time()
        a.hset(FAST_BALANCE_KEY, mapping={"spends": -2, "plan": -1, "out": -1})
        a.sadd(FAST_EXHAUSTED_KEY, "spends", "plan", "out")
        a.hset(FAST_PERIOD_KEY, "plan", "1 3600 10")
        a.hset(usage_key(int(now) // USAGE_BUCKET_S), "spends", 30)
        b.hset(FAST_BALANCE_KEY, mapping={"spends": 50, "plan": 5, "out": 0})
        assert spread({"a": a, "b": b}, now) == 1
        parts = [float(c.hget(FAST_BALANCE_KEY, "spends")) for c in (a, b)]
        assert sum(parts) == pytest.approx(48.0) and parts[0] > 47.9
        assert not a.sismember(FAST_EXHAUSTED_KEY, "spends")
        assert [a.hget(FAST_BALANCE_KEY, "plan"), b.hget(FAST_BALANCE_KEY, "plan")] == [
            b"-1", b"5"]
        assert spread({"a": a, "b": b}, now) == 0  # nothing left to move
    finally:
        for server in servers:
            server.stop()


def test_a_fast_job_of_an_account_spent_in_its_cell_runs_fast_once_beat_spreads(
        two_cells):
    from tasks import submit
    from tasks.broker.keys import FAST_BALANCE_KEY, FAST_EXHAUSTED_KEY
    from tasks.broker.view import snapshot_cache
    from tasks.jobs.accounts import fast_seconds_left

    a, b = (two_cells[name].redis.client() for name in WARM)
    a.hset(FAST_BALANCE_KEY, "studio", 100)
    b.hset(FAST_BALANCE_KEY, "studio", -1)
    b.sadd(FAST_EXHAUSTED_KEY, "studio")
    wait_until(lambda: float(b.hget(FAST_BALANCE_KEY, "studio")) > 0, 30,
               "the first cell's beat to spread the account's seconds")

    def spent_in_b() -> bool:  # as the routers read cell b's snapshot, a round later
        with cell.within("cell-b"):
            view = snapshot_cache().view()
        return view is None or "studio" in view.exhausted
    wait_until(lambda: not spent_in_b(), 30, "cell b's snapshot to list it spent no more")
    assert fast_seconds_left("studio") == pytest.approx(99.0, abs=0.01)
    done = submit(model="typed", tier="fast", account="studio", count=7).get(timeout=60)
    assert done["lane"] == "fast"
