"""Prometheus metrics for gpulanes, read from Redis at each scrape.

Workers add each job's outcome to one Redis hash (``METRICS_KEY``: histogram
buckets of queue wait and run time per lane, downgrades, retries, failures),
in the Redis calls ``tasks.worker.generate`` makes anyway once the outcome is
settled (so a redelivered job is never counted twice); submitters count
cache outcomes there, and
beat's snapshot holds lanes and workers. The exporter
(``celery -A tasks lanes exporter``) keeps no state of its own: any number
of them, restarted at any time, report the same cluster-wide figures.
"""
from __future__ import annotations

import base64
import hmac
import ipaddress
import json
import socket
import threading
from socketserver import ThreadingMixIn
from typing import Any, Callable, Iterator
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer

import redis
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.registry import Collector

from routing.names import LANES
from tasks.broker.keys import (
    DEAD_KEY,
    FAST_BALANCE_KEY,
    METRICS_KEY,
    SCALING_KEY,
    SNAPSHOT_KEY,
    WORKERS_KEY,
    metric_field,
)
from tasks.jobs.usage import QUEUE_WAIT_BUCKETS_S, RUN_BUCKETS_S

#: Default port of the exporter (``--port``).
EXPORTER_PORT = 9808


def histogram(name: str, doc: str, counts: dict[str, str], field: str,
              bounds: tuple[float, ...]) -> HistogramMetricFamily:
    """Per-lane histogram from per-bucket counts (``field|lane|index``), made cumulative."""
    family = HistogramMetricFamily(name, doc, labels=["lane"])
    for lane in LANES:
        running, buckets = 0.0, []
        for index, bound in enumerate((*bounds, float("inf"))):
            running += float(counts.get(metric_field(f"{field}_bucket", lane, str(index)), 0))
            buckets.append(("+Inf" if bound == float("inf") else f"{bound:g}", running))
        total = float(counts.get(metric_field(f"{field}_sum", lane), 0))
        family.add_metric([lane], buckets, total)
    return family


def by_label(name: str, doc: str, label: str, counts: dict[str, str],
             prefix: str) -> CounterMetricFamily:
    """A counter with one label, from the fields ``prefix|value``."""
    family = CounterMetricFamily(name, doc, labels=[label])
    for field, amount in sorted(counts.items()):
        head, _, value = field.partition("|")
        if head == prefix and value:
            family.add_metric([value], float(amount))
    return family


def lane_metrics(snapshot: dict[str, Any]) -> Iterator[Metric]:
    """Depth, expected wait and overload state per lane, from beat's snapshot."""
    lanes, policy = snapshot.get("lanes", {}), snapshot.get("policy", {})
    depth = GaugeMetricFamily("gpulanes_lane_depth", "Jobs queued in the lane "
                              "(every priority level and worker queue)", labels=["lane"])
    wait = GaugeMetricFamily("gpulanes_lane_expected_wait_seconds",
                             "Expected wait of a job entering the lane now", labels=["lane"])
    over = GaugeMetricFamily("gpulanes_lane_overloaded",
                             "1 while the lane is overloaded (hysteresis state)", labels=["lane"])
    for lane in LANES:
        load = lanes.get(lane, {})
        depth.add_metric([lane], load.get("depth", 0))
        wait.add_metric([lane], load.get("expected_wait_s", 0))
        over.add_metric([lane], 1.0 if policy.get(lane, {}).get("overloaded") else 0.0)
    yield from (depth, wait, over)


def pool_metrics(pools: dict[str, Any]) -> Iterator[Metric]:
    """Each pool's workers: wanted (beat's scaling signal, ``beat.scaling``) and current."""
    wanted = GaugeMetricFamily("gpulanes_pool_workers_wanted", "Workers the pool needs for "
                               "every lane to meet its wait budget", labels=["pool"])
    current = GaugeMetricFamily("gpulanes_pool_workers_current",
                                "Workers of the pool serving now", labels=["pool"])
    for name, pool in sorted(pools.items()):
        wanted.add_metric([name], pool.get("wanted", 0))
        current.add_metric([name], pool.get("current", 0))
    yield from (wanted, current)


def worker_metrics(snapshot: dict[str, Any]) -> Iterator[Metric]:
    """Health (up, sick, stuck), load, warm models and cold-start seconds per worker."""
    up = GaugeMetricFamily("gpulanes_worker_up", "1 while the worker answers heartbeats",
                           labels=["worker"])
    sick = GaugeMetricFamily("gpulanes_worker_sick", "1 while the worker stepped aside after "
                             "failures of its own making (disk, device)", labels=["worker"])
    stuck = GaugeMetricFamily("gpulanes_worker_stuck", "1 while a finished run of the worker "
                              "holds a job slot (it exits if it lasts)", labels=["worker"])
    busy = GaugeMetricFamily("gpulanes_worker_in_flight", "Jobs the worker is running",
                             labels=["worker"])
    warm = GaugeMetricFamily("gpulanes_worker_warm_models", "Models the worker holds warm",
                             labels=["worker"])
    cold = GaugeMetricFamily("gpulanes_model_cold_start_seconds",
                             "What loading the model cost the worker", labels=["worker", "model"])
    for host, worker in sorted(snapshot.get("workers", {}).items()):
        up.add_metric([host], 1.0 if worker.get("alive") else 0.0)
        sick.add_metric([host], 1.0 if worker.get("sick") else 0.0)
        stuck.add_metric([host], 1.0 if worker.get("stuck") else 0.0)
        busy.add_metric([host], sum(worker.get("in_flight", {}).values()))
        warm.add_metric([host], len(worker.get("warm_models", ())))
        for model, load_ms in sorted(worker.get("load_ms", {}).items()):
            cold.add_metric([host, model], load_ms / 1000)
    yield from (up, sick, stuck, busy, warm, cold)


def job_metrics(counts: dict[str, str]) -> Iterator[Metric]:
    """What the workers and submitters counted in ``METRICS_KEY``."""
    yield histogram("gpulanes_queue_wait_seconds", "Seconds from submit to start, per lane "
                    "a job ran in", counts, "queue_wait", QUEUE_WAIT_BUCKETS_S)
    yield histogram("gpulanes_run_seconds", "Seconds a job ran on its GPU, per lane",
                    counts, "run", RUN_BUCKETS_S)
    yield by_label("gpulanes_downgrades", "Jobs that ran below their tier, by reason",
                   "reason", counts, "downgrades")
    yield by_label("gpulanes_retries", "Job retries, by the lane the failed run was in",
                   "lane", counts, "retries")
    yield by_label("gpulanes_failures", "Jobs that failed for good, by lane", "lane",
                   counts, "failures")
    yield by_label("gpulanes_preemptions", "Running jobs that stepped aside for a fast job, "
                   "by the lane they ran in", "lane", counts, "preemptions")
    for kind, doc in (("hits", "Seeded jobs answered from the result cache"),
                      ("joins", "Seeded jobs that joined an identical run in flight"),
                      ("misses", "Seeded jobs that found neither and ran")):
        family = CounterMetricFamily(f"gpulanes_cache_{kind}", doc)
        family.add_metric([], float(counts.get(f"cache_{kind}", 0)))
        yield family
    for name, field, doc in (
            ("gpulanes_recovered", "recovered", "Jobs a dead or frozen worker held, put "
             "back in their lanes by beat's health check"),
            ("gpulanes_stale_runs", "stale_runs", "Runs stopped because a newer run had "
             "taken their job over while they were frozen or cut off")):
        family = CounterMetricFamily(name, doc)
        family.add_metric([], float(counts.get(field, 0)))
        yield family


class LanesCollector(Collector):
    """Every gpulanes metric, read from Redis in one pipelined round trip per scrape."""

    def __init__(self, client: redis.Redis) -> None:
        self.client = client

    def collect(self) -> Iterator[Metric]:
        with self.client.pipeline(transaction=False) as pipe:
            pipe.get(SNAPSHOT_KEY).hgetall(METRICS_KEY).hlen(DEAD_KEY).hgetall(FAST_BALANCE_KEY)
            pipe.hgetall(WORKERS_KEY).get(SCALING_KEY)
            raw, counts, dead, balances, records, scaling = pipe.execute()
        snapshot = json.loads(raw) if raw else {}
        # the snapshot routers read is compact; the worker record is beat's hash of them
        snapshot["workers"] = {(h.decode() if isinstance(h, bytes) else h): json.loads(w)
                               for h, w in records.items()}
        yield from lane_metrics(snapshot)
        yield from worker_metrics(snapshot)
        yield from pool_metrics(json.loads(scaling).get("pools", {}) if scaling else {})
        yield from job_metrics(counts)
        jobs = CounterMetricFamily("gpulanes_jobs", "Jobs finished, per lane they ran in",
                                   labels=["lane"])
        for lane in LANES:
            jobs.add_metric([lane], sum(float(v) for k, v in counts.items()
                                        if k.startswith(metric_field("run_bucket", lane, ""))))
        yield jobs
        yield GaugeMetricFamily("gpulanes_dead_letters", "Jobs in the dead-letter list",
                                value=dead)
        left = GaugeMetricFamily("gpulanes_fast_seconds_balance",
                                 "Fast GPU seconds an account has left", labels=["account"])
        for account, seconds in sorted(balances.items()):
            left.add_metric([account], float(seconds))
        yield left


#: The fields of each pool that ``/scaling`` serves.
SCALING_FIELDS = ("wanted", "current", "need")


def scaling_app(client: redis.Redis, metrics: Callable) -> Callable:
    """``metrics`` (the Prometheus app), and ``/scaling``: each pool's workers wanted and
    current as JSON, as KEDA's ``metrics-api`` trigger reads it
    (``valueLocation: pools.<pool>.wanted``)."""
    def app(environ: dict, start_response: Callable) -> Any:
        if environ.get("PATH_INFO") != "/scaling":
            return metrics(environ, start_response)
        raw = client.get(SCALING_KEY)
        found = json.loads(raw) if raw else {"at": None, "pools": {}}
        body = json.dumps({"at": found.get("at"), "pools": {
            name: {k: pool.get(k, 0) for k in SCALING_FIELDS}
            for name, pool in sorted(found.get("pools", {}).items())}}).encode()
        start_response("200 OK", [("Content-Type", "application/json"),
                                  ("Content-Length", str(len(body)))])
        return [body]
    return app


def basic_auth(app: Callable, login: str) -> Callable:
    """``app`` behind HTTP basic auth with ``login`` (``user:password``)."""
    expected = "Basic " + base64.b64encode(login.encode()).decode()

    def guarded(environ: dict, start_response: Callable) -> Any:
        given = environ.get("HTTP_AUTHORIZATION", "")
        if hmac.compare_digest(given.encode(), expected.encode()):
            return app(environ, start_response)
        start_response("401 Unauthorized", [("WWW-Authenticate", 'Basic realm="gpulanes"'),
                                            ("Content-Type", "text/plain")])
        return [b"login required\n"]
    return guarded


def is_loopback(address: str) -> bool:
    """Whether ``address`` only listens on this host."""
    try:
        return address == "localhost" or ipaddress.ip_address(address).is_loopback
    except ValueError:
        return False


class QuietHandler(WSGIRequestHandler):
    """Scrapes every few seconds would flood stderr with access lines: log none."""

    def log_message(self, format: str, *args: Any) -> None:
        pass


def address_family(address: str, port: int) -> socket.AddressFamily:
    """The family ``address`` binds with (IPv6 for ``::1``), as getaddrinfo resolves it:
    the stdlib's WSGIServer is IPv4 only."""
    infos = socket.getaddrinfo(address, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    return infos[0][0]


def make_server(address: str, port: int, app: Callable) -> WSGIServer:
    """A thread-per-request WSGI server for ``app`` on ``address:port``."""
    family = address_family(address, port)

    class Server(ThreadingMixIn, WSGIServer):
        address_family = family
        daemon_threads = True  # a hung scrape never holds up the exporter's exit

    server = Server((address, port), QuietHandler)
    server.set_app(app)
    return server


def serve(client: redis.Redis, port: int = EXPORTER_PORT, address: str = "127.0.0.1",
          login: str | None = None) -> Any:
    """Serve ``/metrics`` and ``/scaling`` (:func:`scaling_app`) on ``address:port`` in a
    background thread; returns the server.

    With ``login`` (``user:password``) every request must carry it; without one
    only a loopback address is allowed: the exporter never opens to a network
    without its setting (GPULANES_EXPORTER_AUTH).
    """
    from prometheus_client import CollectorRegistry, make_wsgi_app

    if not login and not is_loopback(address):
        raise PermissionError(f"the exporter will not listen on {address} without a login; "
                              "set GPULANES_EXPORTER_AUTH=user:password")
    registry = CollectorRegistry()
    registry.register(LanesCollector(client))
    # public API: content negotiation, gzip, name[] filters
    app = scaling_app(client, make_wsgi_app(registry))
    server = make_server(address, port, basic_auth(app, login) if login else app)
    threading.Thread(target=server.serve_forever, name="gpulanes-exporter",
                     daemon=True).start()
    return server
