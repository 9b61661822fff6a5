"""The Prometheus exporter, scraped for real over HTTP while a real worker runs jobs."""
from __future__ import annotations

import base64
import json
import os
import socket
import subprocess
import sys
import urllib.request
from pathlib import Path

import pytest
from conftest import SMALL, free_port, http_status, wait_until
from prometheus_client.parser import text_string_to_metric_families

from tasks import submit
from tasks.broker.keys import (DEAD_KEY, FAIR_WINDOW_S, METRICS_KEY, SNAPSHOT_KEY, WORKERS_KEY,
                               metric_field, usage_key)
from tasks.errors import JobFailed
from tasks.jobs.usage import job_counts

PROJECT_DIR = Path(__file__).resolve().parent.parent


def test_a_job_counts_its_buckets_sums_downgrade_and_its_accounts_usage():
    counts = job_counts({"lane": "relaxed", "queued_ms": 700.0, "run_ms": 30.0,
                         "downgrade_reason": "standard_overloaded"}, "ann", now=3 * 60 + 5)
    assert counts == {(METRICS_KEY, metric_field("queue_wait_bucket", "relaxed", "4")): 1,
                      (METRICS_KEY, metric_field("queue_wait_sum", "relaxed")): 0.7,
                      (METRICS_KEY, metric_field("run_bucket", "relaxed", "2")): 1,
                      (METRICS_KEY, metric_field("run_sum", "relaxed")): 0.03,
                      (METRICS_KEY, metric_field("downgrades", "standard_overloaded")): 1,
                      (usage_key(3), "ann"): 0.03}  # the bucket of its finish (60 s each)


def _scrape(port: int) -> dict[tuple[str, tuple], float]:
    """{(sample name, sorted labels): value} of one scrape, or {} while it does not answer."""
    try:
        text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=2).read()
    except OSError:
        return {}
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(text.decode()) for s in family.samples}


@pytest.fixture()
def exporter(redis_server):
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "celery", "-A", "tasks", "lanes", "exporter",
                             f"--port={port}"], cwd=PROJECT_DIR, env=os.environ.copy(),
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        wait_until(lambda: _scrape(port), timeout_s=30, what="the exporter to answer")
        yield port
    finally:
        proc.terminate()
        try:
            assert proc.wait(timeout=20) == 0  # SIGTERM ends it cleanly
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()


@pytest.mark.cluster
def test_the_exporter_reports_what_the_cluster_did(cluster_factory, clean_redis, exporter):
    cluster = cluster_factory(workers=1, beat=True)
    ran = [submit(f"metrics {i}", tier=tier, seed=i, **SMALL).get(timeout=60)
           for i, tier in enumerate(("fast", "fast", "standard"))]
    ran.append(submit("transient:1 once", model="flaky", seed=7, tier="fast", **SMALL)
               .get(timeout=60))  # one retry, then it runs one lane down
    with pytest.raises(JobFailed):
        submit("bug here", model="flaky", seed=8, **SMALL).get(timeout=60)
    first = [submit("same picture", seed=5, **SMALL).get(timeout=60) for _ in range(2)]
    hit = submit("same picture", seed=5, **SMALL).get(timeout=60)  # admitted on the 2nd run
    assert hit["cached"] and not any(r["cached"] for r in first)
    ran += first
    host = cluster.hostnames[0]
    wait_until(lambda: clean_redis.get(SNAPSHOT_KEY) and json.loads(
        clean_redis.hget(WORKERS_KEY, host) or "{}").get("alive"),
        what="a snapshot with the worker in it")

    def counted() -> float:  # the worker adds its jobs' counts with its next stats push
        m = _scrape(exporter)
        return sum(m.get(("gpulanes_jobs_total", (("lane", lane),)), 0)
                   for lane in ("fast", "standard", "relaxed"))
    wait_until(lambda: counted() == len(ran), what="the worker's pushed job counts")
    m = _scrape(exporter)

    for lane in ("fast", "standard", "relaxed"):
        jobs = sum(r["lane"] == lane for r in ran)
        assert m[("gpulanes_jobs_total", (("lane", lane),))] == jobs, lane
        assert m[("gpulanes_queue_wait_seconds_count", (("lane", lane),))] == jobs
        assert m[("gpulanes_queue_wait_seconds_sum", (("lane", lane),))] == pytest.approx(
            sum(r["queued_ms"] for r in ran if r["lane"] == lane) / 1000, abs=0.01)
        assert m[("gpulanes_run_seconds_bucket", (("lane", lane), ("le", "+Inf")))] == jobs
    assert m[("gpulanes_retries_total", (("lane", "fast"),))] == 1
    assert m[("gpulanes_downgrades_total", (("reason", "retry"),))] == 1
    # the standard job that failed may have been downgraded by the load of the ones before it
    failures = {lane: m.get(("gpulanes_failures_total", (("lane", lane),)), 0)
                for lane in ("fast", "standard", "relaxed")}
    assert sum(failures.values()) == 1 and failures["fast"] == 0, failures
    assert m[("gpulanes_dead_letters", ())] == 1
    # every seeded job before the hit missed (each "same picture" ran after the last finished)
    assert (m[("gpulanes_cache_hits_total", ())], m[("gpulanes_cache_joins_total", ())],
            m[("gpulanes_cache_misses_total", ())]) == (1, 0, 7)
    assert m[("gpulanes_worker_up", (("worker", host),))] == 1
    assert m[("gpulanes_model_cold_start_seconds", (("model", "demo"), ("worker", host)))] > 0
    assert ("gpulanes_lane_expected_wait_seconds", (("lane", "relaxed"),)) in m
    assert m[("gpulanes_fast_seconds_balance", (("account", "anonymous"),))] < 3600
    # beat's scaling signal for the one (default) pool, as Prometheus and KEDA read it
    assert m[("gpulanes_pool_workers_current", (("pool", "default"),))] == 1
    assert ("gpulanes_pool_workers_wanted", (("pool", "default"),)) in m
    pools = json.loads(urllib.request.urlopen(f"http://127.0.0.1:{exporter}/scaling",
                                              timeout=5).read())["pools"]
    assert pools["default"]["current"] == 1 and pools["default"]["wanted"] >= 0


def test_the_exporter_asks_for_its_login_and_never_opens_without_it(redis_server):
    from tasks.broker.store import connect
    from tasks.ops.metrics import serve

    client = connect(os.environ["GPULANES_BROKER_URL"])
    with pytest.raises(PermissionError, match="GPULANES_EXPORTER_AUTH"):
        serve(client, free_port(), "0.0.0.0")
    server = serve(client, free_port(), "0.0.0.0", login="prometheus:s3cret")
    try:
        url = f"http://127.0.0.1:{server.server_port}/metrics"
        assert http_status(url) == 401 and http_status(url, "prometheus:wrong") == 401
        assert http_status(url, "prometheus:s3cret") == 200
    finally:
        server.shutdown()
        server.server_close()
    proc = subprocess.run([sys.executable, "-m", "celery", "-A", "tasks", "lanes", "exporter",
                           "--address", "0.0.0.0", f"--port={free_port()}"], cwd=PROJECT_DIR,
                          env={k: v for k, v in os.environ.items()
                               if k != "GPULANES_EXPORTER_AUTH"},
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode != 0 and "GPULANES_EXPORTER_AUTH" in proc.stderr


def _get(url: str, login: str, accept: str | None = None) -> tuple[str, bytes]:
    """(Content-Type, body) of a GET with basic auth and an optional Accept header."""
    request = urllib.request.Request(url)
    request.add_header("Authorization", "Basic " + base64.b64encode(login.encode()).decode())
    if accept:
        request.add_header("Accept", accept)
    with urllib.request.urlopen(request, timeout=2) as response:
        return response.headers["Content-Type"], response.read()


def _ipv6_loopback() -> bool:
    try:
        with socket.socket(socket.AF_INET6) as sock:
            sock.bind(("::1", 0))
        return True
    except OSError:
        return False


@pytest.mark.skipif(not _ipv6_loopback(), reason="no IPv6 loopback on this host")
def test_the_exporter_serves_ipv6_negotiates_openmetrics_and_logs_no_scrapes(clean_redis,
                                                                           capfd):
    from tasks.broker.store import connect
    from tasks.ops.metrics import serve

    clean_redis.hset(DEAD_KEY, "j1", "{}")
    server = serve(connect(os.environ["GPULANES_BROKER_URL"]), free_port(), "::1",
                   login="prometheus:s3cret")
    try:
        url = f"http://[::1]:{server.server_port}/metrics"
        assert http_status(url) == 401
        kind, body = _get(url, "prometheus:s3cret", "application/openmetrics-text")
        assert kind.startswith("application/openmetrics-text") and body.endswith(b"# EOF\n")
        kind, body = _get(url, "prometheus:s3cret")
        assert kind.startswith("text/plain")
        samples = {s.name: s.value for family in text_string_to_metric_families(body.decode())
                   for s in family.samples}
        assert samples["gpulanes_dead_letters"] == 1
    finally:
        server.shutdown()
        server.server_close()
    assert "GET /metrics" not in capfd.readouterr().err  # scrapes are not access-logged


def test_a_workers_counts_are_added_once_per_batch(clean_redis):
    """A worker adds its jobs' counts with its stats push; a batch sent again (its
    reply lost) is not added twice, and counts that came meanwhile wait for the next.
    An account's usage bucket lasts as long as fair shares read it."""
    from tasks.broker.stats import push_stats
    from tasks.jobs.usage import PendingCounts

    run_sum, used = (METRICS_KEY, "run_sum|fast"), (usage_key(7), "ann")
    counts = PendingCounts()
    assert counts.batch() is None  # nothing finished: nothing to add
    counts.add({run_sum: 0.5, (METRICS_KEY, "jobs|fast"): 1, used: 0.5})
    counts.add({run_sum: 0.25, used: 0.25})
    batch = counts.batch()
    assert batch == (1, {run_sum: 0.75, (METRICS_KEY, "jobs|fast"): 1, used: 0.75})
    counts.add({run_sum: 1.0})  # finished while the push is out
    for _ in range(2):  # the first reply was lost: the same batch again
        push_stats(clean_redis, "gpu0@h", {}, ("gpu0@h/1/1.0", *counts.batch()))
    assert float(clean_redis.hget(METRICS_KEY, "run_sum|fast")) == 0.75
    assert float(clean_redis.hget(usage_key(7), "ann")) == 0.75
    assert clean_redis.ttl(METRICS_KEY) == -1  # metrics last
    assert 0 < clean_redis.ttl(usage_key(7)) <= FAIR_WINDOW_S + 60
    counts.pushed(batch[0])
    assert counts.batch() == (2, {run_sum: 1.0})
    push_stats(clean_redis, "gpu0@h", {}, ("gpu0@h/1/1.0", *counts.batch()))
    assert float(clean_redis.hget(METRICS_KEY, "run_sum|fast")) == 1.75
