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
from conftest import STATE_DIR, free_port, wait_until

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


def test_a_new_job_goes_to_a_cell_its_model_fits_where_it_is_warm(monkeypatch):
    """Of the cells its model fits, a job goes to the first by rendezvous hashing on the
    model where it is warm, else to the first; a job with an idempotency key to the
    first, warm or not; one that fits nowhere to the first (its submit then refuses it)."""
    from routing.policy import PolicyView

    names = ("a", "b", "c")

    class Cache:  # a cell's snapshot cache, as cells.cell_of_job reads it
        def __init__(self, name: str) -> None:
            self.name = name

        def members(self) -> PolicyView:
            return views[self.name]

    with override(broker_url=", ".join(f"{n}=redis://r{n}/0" for n in names)):
        order = cells._order("m", names)
        views = {name: PolicyView(holders={}) for name in names}  # warm nowhere
        monkeypatch.setattr(cells, "_caches", lambda _: {n: Cache(n) for n in names})
        assert cells.cell_of_job("m") == order[0]
        views[order[2]] = PolicyView(holders={"m": frozenset({"gpu0@w"})})
        assert cells.cell_of_job("m") == order[2]
        assert cells.cell_of_job("m", keyed=True) == order[0]

        def fits(view: PolicyView) -> bool:  # too large for the first cell's workers
            return view is not views[order[0]]
        assert cells.cell_of_job("m", True, fits) == order[1]
        views[order[2]] = PolicyView(holders={})
        assert cells.cell_of_job("m", False, fits) == order[1]
        assert cells.cell_of_job("m", False, lambda view: False) == order[0]


def test_a_revoke_is_kept_in_the_cell_its_job_runs_in(two_cells):
    """A job revoked by a process that knows both cells is kept revoked in the cell its
    id names, where its run would begin (and be refused), and nowhere else."""
    from tasks.broker.keys import revoked_key

    a, b = (two_cells[name].redis.client() for name in WARM)
    for name, here, other in (("cell-a", a, b), ("cell-b", b, a)):
        job_id = cell.new_job_id(name)
        cells.result(job_id).revoke()
        assert here.exists(revoked_key(job_id)) and not other.exists(revoked_key(job_id))


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


def test_the_http_api_spans_the_cells(two_cells):
    """One API process and one webhook sender that know both cells: each prediction runs
    in its model's cell, which its id names; reading it, the account's list (merged,
    newest first, a page at a time), its events, its signed webhooks and the account's
    fast seconds span the cells; an idempotency key makes one prediction."""
    import time

    import httpx
    from standardwebhooks.webhooks import Webhook

    from tasks.broker.keys import FAST_BALANCE_KEY, FAST_PERIOD_KEY
    from tasks.jobs import apikeys
    from tests.harness import sse
    from tests.harness.hooks import Receiver, Sender
    from tests.harness.http import ApiServer

    spec = ", ".join(f"{name}={cluster.url}" for name, cluster in two_cells.items())
    env = {"GPULANES_BROKER_URL": spec, "GPULANES_WEBHOOK_ALLOW_PRIVATE": "1"}
    logs = STATE_DIR / "logs" / "test_cells"
    made, _ = apikeys.create(two_cells["cell-a"].redis.client(), "spanning", "standard")
    auth = {"Authorization": f"Bearer {made}"}
    inputs = {"echo": lambda i: {"text": f"job {i}"}, "typed": lambda i: {"count": i}}
    with ApiServer(logs, env=env) as api, Sender(logs, env=env), Receiver() as receiver, \
            httpx.Client(base_url=api.url, timeout=30) as http:
        def create(model: str, i: int, **headers: str) -> dict:
            found = http.post("/v1/predictions", headers={**auth, **headers}, json={
                "model": model, "input": inputs[model](i), "webhook": receiver.url,
                "webhook_events_filter": ["completed"]})
            assert found.status_code == 201, found.text
            return found.json()

        ids = [create(model, i)["id"] for i in range(3) for model in WARM.values()]
        for job_id, model in zip(ids, [*WARM.values()] * 3):
            assert cell.named_by(job_id) == next(n for n, m in WARM.items() if m == model)
        def succeeded(job_id: str) -> dict | None:
            found = http.get(f"/v1/predictions/{job_id}", headers=auth).json()
            return found if found["status"] == "succeeded" else None

        done = {job_id: wait_until(lambda: succeeded(job_id), 60, f"{job_id} to succeed")
                for job_id in ids}
        assert done[ids[0]]["output"] == {"text": "job 0"}
        assert "fields_set" in done[ids[1]]["output"]  # the typed model's
        listed, url = [], "/v1/predictions?limit=2"
        while url:
            page = http.get(url, headers=auth).json()
            assert len(page["results"]) <= 2
            listed += [p["id"] for p in page["results"]]
            url = page["next"]
        assert listed == ids[::-1], "every prediction once, newest first, across the cells"
        in_b = ids[1]
        got = sse.read(http, f"/v1/predictions/{in_b}/events", auth)
        assert got[-1]["event"] == "completed" and got[-1]["data"]["status"] == "succeeded"
        wait_until(lambda: {job_id for job_id in ids if receiver.events(job_id)} == set(ids),
                   60, "a completed webhook of every prediction")
        secret = http.get("/v1/webhooks/default/secret", headers=auth).json()["key"]
        for delivery in receiver.got:
            Webhook(secret).verify(delivery.raw, delivery.headers)  # one secret, any cell
        first = create("typed", 7, **{"Idempotency-Key": "order-1"})
        again = create("typed", 7, **{"Idempotency-Key": "order-1"})
        assert again["id"] == first["id"]
        account = http.get("/v1/account", headers=auth).json()
        assert account["fast_seconds_left"] == account["limits"]["fast_seconds"]  # untouched
        period_s = account["limits"]["period_s"]
        for name, part in (("cell-a", 3.0), ("cell-b", 4.5)):  # each cell's part, this period
            client = two_cells[name].redis.client()
            client.hset(FAST_BALANCE_KEY, "spanning", part)
            client.hset(FAST_PERIOD_KEY, "spanning", f"{int(time.time() // period_s)} "
                                                     f"{period_s} {part}")
        assert http.get("/v1/account", headers=auth).json()["fast_seconds_left"] == 7.5


def test_pages_across_cells_show_each_prediction_once_newest_first(tmp_path):
    """An account's predictions in three cells, each listed by its own Redis' clock (with
    ties in time, in a cell and across cells), and one another account's: every page size
    shows each of the account's once, newest first by that time, then by id."""
    import random

    from tasks.broker.keys import prediction_key, predictions_key
    from tasks.front import paging

    rng = random.Random(5)
    servers = {name: EmbeddedRedis(tmp_path / name).start() for name in ("a", "b", "c")}
    try:
        listed = []
        for n, server in enumerate(servers.values()):
            client = server.client()
            for i in range(12):
                job_id = f"{uuid.uuid4()}"[:-2] + f"{n:02x}"
                account = "pages" if i else "another"  # listed in its list all the same
                body = {"id": job_id, "account": account, "model": "echo", "input": {},
                        "tier": "standard", "created_at": 1_000.0, "cancel_after_at": None}
                client.hset(prediction_key(job_id), mapping={"json": json.dumps(body)})
                at = 1_000 + rng.choice(range(8)) * 0.25  # ties, here and in other cells
                client.zadd(predictions_key("pages"), {job_id: at})
                listed.append((at, job_id, account))
        newest_first = [job_id for _, job_id, account in sorted(listed, reverse=True)
                        if account == "pages"]
        spec = ", ".join(f"{name}={server.url}" for name, server in servers.items())
        with override(broker_url=spec):
            for limit in (1, 2, 5, 33, 36, 50):
                shown, cursor = [], None
                for _ in range(len(listed) + 1):  # a page at least each, or a loop
                    page, cursor = paging.page("pages", cursor, limit)
                    assert len(page) <= limit
                    shown += [p.id for p in page]
                    if cursor is None:
                        break
                assert cursor is None and shown == newest_first, limit
    finally:
        for server in servers.values():
            server.stop()


def test_the_api_names_the_cells_whose_redis_does_not_answer_as_it_starts(tmp_path):
    from tasks.front.serve import silent_redis

    assert silent_redis() == []  # the session's one Redis
    server = EmbeddedRedis(tmp_path / "a").start()
    try:
        with override(broker_url=f"a={server.url}, b=redis://127.0.0.1:{free_port()}/0"):
            assert silent_redis() == ["b"]
    finally:
        server.stop()
