"""Test session: a private embedded Redis, configured before ``tasks`` is imported.

Each test starts from clean lanes and results; kombu's own bindings stay so
that workers started by a module fixture keep consuming.
"""
from __future__ import annotations

import base64
import gc
import os
import shutil
import socket
import tempfile
import time
import urllib.error
import urllib.request
import uuid
from pathlib import Path
from typing import Any

import pytest

# A short path: Unix socket paths are limited to about 100 bytes.
from gpu_worker.redis_server import EmbeddedRedis  # noqa: E402  reads no settings

STATE_DIR = Path(tempfile.mkdtemp(prefix="gl-test-", dir="/tmp"))
TEST_ENV = {
    "GPULANES_BROKER_URL": EmbeddedRedis(STATE_DIR).url,
    "GPULANES_STATE_DIR": str(STATE_DIR),
    "GPULANES_ARTIFACT_DIR": str(STATE_DIR / "artifacts"),
    "GPULANES_MODEL_DIR": str(STATE_DIR / "models"),
    "GPULANES_MODELS": ",".join([*(f"{name}=gpu_worker.demo_model:load" for name in
                                   ("demo", "demo-0", "demo-1", "demo-2")),
                                 "flaky=tests.flaky_model:load", "echo=tasks.models.echo:Echo",
                                 "odd=tests.odd_models:Odd", "tiny-sd=tests.odd_models:TinySd",
                                 "tiny-bert=tests.odd_models:TinyBert",
                                 "typed=tests.typed_model:Typed",
                                 "blob=tests.blob_model:Blob",
                                 "paced=benchmarks.paced_model:Paced"]),
    "GPULANES_DEVICE": "cpu",
    "GPULANES_HEARTBEAT_S": "1",
    "GPULANES_WARM_MODELS": "demo",
    "PYTHONPATH": os.pathsep.join(filter(None, [str(Path(__file__).parent.parent),
                                                os.environ.get("PYTHONPATH")])),
}
os.environ.update(TEST_ENV)  # before anything imports celeryconfig

#: Job parameters that keep a real generation to a few milliseconds.
SMALL = dict(steps=4, width=64, height=64)


def wait_at_gate(result, gate: str, timeout_s: float = 30.0) -> None:
    """Wait until a ``gate:NAME`` job runs inside the model, held at its gate."""
    from tests.flaky_model import at_gate

    wait_until(lambda: at_gate(gate), timeout_s, what=f"job {result.id} to reach its gate")


def free_port() -> int:
    """A TCP port nobody listens on now."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def http_status(url: str, auth: str | None = None) -> int | None:
    """The HTTP status of a GET (with basic ``user:password``), or None if nobody answers."""
    request = urllib.request.Request(url)
    if auth:
        request.add_header("Authorization", "Basic " + base64.b64encode(auth.encode()).decode())
    try:
        return urllib.request.urlopen(request, timeout=2).status
    except urllib.error.HTTPError as exc:
        return exc.code
    except OSError:
        return None


def poll(predicate, timeout_s: float, every_s: float = 0.05):
    """Poll ``predicate`` until it returns something truthy or ``timeout_s`` passes;
    its last value."""
    deadline = time.monotonic() + timeout_s
    while not (value := predicate()) and time.monotonic() < deadline:
        time.sleep(every_s)
    return value


def wait_until(predicate, timeout_s: float = 30.0, what: str = "condition"):
    """Poll ``predicate`` until it returns something truthy; return that."""
    value = poll(predicate, timeout_s)
    assert value, f"timed out waiting for {what}"
    return value


def fast_waiting(account: str) -> int:
    """How many of ``account``'s fast jobs hold a place now (lapsed ones excluded)."""
    from tasks.broker.app import redis_client
    from tasks.broker.keys import fast_queued_key

    client = redis_client()
    now_s, now_us = client.time()
    return client.zcount(fast_queued_key(account), now_s + now_us / 1e6, "+inf")


@pytest.fixture
def one_torch_thread():
    """Torch on one thread, as a worker runs it (``GPULANES_TORCH_THREADS``)."""
    import torch

    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(previous)


#: The gates made by the test now running: each is opened as it ends, pass or fail, so a
#: failed test leaves no job held at a gate for the tests after it on the same workers.
_GATES: list[str] = []


def new_gate() -> str:
    """A fresh gate name for ``gate:NAME`` prompts of the flaky model."""
    _GATES.append(uuid.uuid4().hex[:12])
    return _GATES[-1]


#: Lines of each cluster log a failed test's report ends with, of what it wrote meanwhile.
LOG_LINES = 200
#: Where a test's item keeps the cluster logs' sizes as it began.
_LOGS_AT = pytest.StashKey[dict]()


def _cluster_logs() -> dict[Path, int]:
    """Every cluster log of this session and its size now."""
    return {log: log.stat().st_size for log in (STATE_DIR / "logs").glob("*/*.log")}


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_call(item):
    item.stash[_LOGS_AT] = _cluster_logs()
    yield


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    """A failed test's report carries what the clusters' processes logged while it ran
    (the tail of it): a failure on a loaded CI machine can be read afterwards."""
    outcome = yield
    report = outcome.get_result()
    if report.when != "call" or not report.failed or _LOGS_AT not in item.stash:
        return
    before = item.stash[_LOGS_AT]
    for log, size in sorted(_cluster_logs().items()):
        with open(log, "rb") as f:
            f.seek(before.get(log, 0) if size >= before.get(log, 0) else 0)
            lines = f.read().decode(errors="replace").splitlines()[-LOG_LINES:]
        if lines:
            report.sections.append((f"cluster log {log.parent.name}/{log.name}",
                                    "\n".join(lines)))


@pytest.fixture(scope="session")
def redis_server():
    server = EmbeddedRedis(STATE_DIR).start()
    yield server
    gc.collect()  # results unsubscribe while Redis still answers, not at exit
    server.stop()
    if not os.environ.get("GPULANES_TEST_KEEP"):  # set it to read the logs afterwards
        shutil.rmtree(STATE_DIR, ignore_errors=True)


def drop_keys(client) -> None:
    """Drop every key but the queue bindings and the idle consumers' wake sets (a
    module's workers live on across its tests): no job or state of an earlier test."""
    keys = [k for k in client.scan_iter(count=1000)
            if not k.startswith((b"_kombu.binding", b"gpulanes:bindings:", b"gpulanes:wake:"))]
    if keys:
        client.delete(*keys)


@pytest.fixture(autouse=True)
def clean_redis(redis_server):
    """Drop every key but kombu's queue bindings before each test, and after it: a job a
    test left queued must not reach the workers the next module starts."""
    client = redis_server.client()
    drop_keys(client)
    shutil.rmtree(STATE_DIR / "flaky", ignore_errors=True)  # the test model's run counts
    from tasks.broker.enqueue import _places_taken
    from tasks.broker.view import snapshot_cache
    if snapshot_cache.cache_info().currsize:  # the router's copy of the deleted snapshot
        snapshot_cache().forget()
    _places_taken.clear()  # what this process learnt of the deleted fast places
    yield client
    from tests.flaky_model import open_gate
    while _GATES:
        open_gate(_GATES.pop())
    drop_keys(client)


@pytest.fixture
def http(api):
    """An httpx client of the module's own ``api`` fixture (a ``tests.harness.http``
    ``ApiServer``)."""
    import httpx

    with httpx.Client(base_url=api.url, timeout=30) as client:
        yield client


@pytest.fixture
def key(clean_redis):
    """``key(account, plan)``: the headers of a new API key."""
    from tasks.jobs import apikeys

    def make(account: str = "studio", plan: str = "standard") -> dict[str, str]:
        made, _ = apikeys.create(clean_redis, account, plan)
        return {"Authorization": f"Bearer {made}"}
    return make


@pytest.fixture(scope="session")
def app(redis_server):
    from tasks import app
    return app


@pytest.fixture
def leading(clean_redis):
    """The test runs beat's code as beat's scheduler does: under a leader's epoch (beat's
    rounds write nothing without one)."""
    from beat.lease import Leadership
    from tasks.broker.leader import fenced

    with fenced(Leadership(clean_redis).renew()):
        yield


@pytest.fixture(scope="module")
def cluster_factory(redis_server, app, request):
    """Start local clusters on the session Redis; all are stopped after the module."""
    from tasks.dev.cluster import LocalCluster

    started: list[LocalCluster] = []

    def start(workers: int = 1, beat: bool = False, env: dict | None = None) -> LocalCluster:
        name = f"{request.module.__name__}-{len(started)}"
        cluster = LocalCluster(STATE_DIR, workers=workers, device="cpu", beat=beat,
                               env=env, log_dir=STATE_DIR / "logs" / name)
        started.append(cluster)
        return cluster.start(app, timeout_s=120)

    yield start
    for cluster in started:
        cluster.stop()


def scripts_called(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The names of the Lua scripts this process runs from now on, in order."""
    from tasks.broker import scripts

    called, run = [], scripts.run
    monkeypatch.setattr(scripts, "run", lambda client, name, *a: called.append(name)
                        or run(client, name, *a))
    return called


def vary(monkeypatch: pytest.MonkeyPatch, **values: Any) -> None:
    """These settings (by field name) in force in this process until the test ends."""
    import tasks.settings as gl

    changes = {**gl._changes[-1], **values}
    monkeypatch.setattr(gl, "_changes", [*gl._changes, changes])
    monkeypatch.setattr(gl, "_current", [gl.load(**changes)])


def bind_own_queues(app, *queues: str) -> None:
    """Declare workers' own queues (their exchange and binding), as a live worker does:
    a publish to one is routed to its list."""
    from kombu import Exchange, Queue

    with app.connection_for_write() as conn:
        for own in queues:
            Queue(own, Exchange(own, "direct"), routing_key=own)(conn.default_channel).declare()
