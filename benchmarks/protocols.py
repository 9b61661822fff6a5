"""Queue protocols with an atomic hand-over, measured against kombu's Redis transport.

``python benchmarks/protocols.py`` starts a private embedded Redis (AOF off: this
measures the protocols, not the disk) and runs, one protocol after another on a
flushed Redis, the same workload (the protocols are in ``benchmarks/protocols_impl.py``):

* **a** dramatiq-style: a Lua script pops the lanes in priority order and adds the id
  to the worker's ack ZSET in the same step (bodies in a hash); a heartbeat hash; idle
  workers poll with a backoff of 1 to 20 ms; maintenance requeues a dead worker's set;
* **b** rq-style: LMOVE from each lane in order into the worker's processing list,
  then a BLMOVE on the fast lane for 50 ms (one BLMOVE serves one list);
* **c** Redis Streams: a stream per lane, one group; XREADGROUP per lane in order,
  then a blocking one on all three for 50 ms; XACK + XDEL; XAUTOCLAIM recovers;
* **k** kombu's stock Redis transport as a plain Celery user has it (``kombu.Connection``,
  direct exchanges, prefetch 1, late ack, lanes read in priority order): BRPOP, then a
  second round trip records the message as unacked;
* **g** gpulanes' transport (``tasks.broker.lanes``), used as **k** is: one Lua script
  moves the next message of the lanes, in order, into the process's record hash
  (``gpulanes:held:<holder>``); an ack drops the record; a push publishes a wake-up
  that idle consumers wait on (pub/sub, no polling); recovery gives a dead holder's
  records back to the fronts of their lists (``handover.put_back_all``).

Throughput: ``--producers`` processes publish ``--jobs`` jobs (lanes in turn, one
round trip each) while ``--consumers`` processes take, "run" (nothing), record and
ack them. Redis commands per job are ``INFO commandstats`` deltas over the jobs;
Redis counts the commands a Lua script calls, so a script's EVALSHA and every call
inside it are counted. Redis CPU per job is ``used_cpu_user + used_cpu_sys``. Then a
fast job is published behind ``--backlog`` relaxed ones (consumers "running" each job
for ``--work-ms``): its wait is publish to take. Idle pickup: one consumer, sent
``--pickups`` fast jobs one at a time, each ``--pickup-gap-ms`` after the last was
taken (so it finds the consumer idle): publish to take; then, with nothing published
for ``--idle-s``, the consumer's CPU (``/proc/<pid>/stat``, every thread, in clock
ticks of 10 ms: 0.2% of a core over 5 s) and the commands Redis runs per second. Crash check: one consumer (1 ms per
job) is SIGKILLed, ``--kills`` times, up to 1.5 ms after it counted a job done: around
its next take or while it holds the job; an *orphan* is a job it
did not finish that is in no lane and under no holder record (kombu's unacked hash
counts as one). A kill between kombu's BRPOP and its unacked record leaves one; that
window is short, so a short run may find none.
"""
from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import random
import signal
import statistics
import sys
import time
from pathlib import Path
from typing import Any

if not __package__:  # run as a script: make the project importable
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from benchmarks.common import (  # noqa: E402
    json_option,
    markdown_table,
    percentile,
    run_private,
    write_json,
)
from benchmarks.protocols_impl import LANES, PROTOCOLS, body_of, consume, produce  # noqa: E402

CRASH_JOBS = 60
#: the kill lands this long at most after the victim counted a job done
KILL_SPREAD_S = 0.0015
WAIT_S = 120.0
IGNORED = ("cmdstat_info", "cmdstat_config", "cmdstat_flushall", "cmdstat_ping")


def until(check: Any, what: str, processes: list[Any] = (), timeout_s: float = WAIT_S) -> None:
    """Poll ``check()`` every millisecond until true; fail naming ``what`` after
    ``timeout_s`` or once one of ``processes`` has died."""
    deadline = time.monotonic() + timeout_s
    while not check():
        if time.monotonic() > deadline or not all(p.is_alive() for p in processes):
            raise RuntimeError(f"gave up waiting for {what}")
        time.sleep(0.001)


def shared_state(ctx: Any, work_ms: float = 0.0) -> dict[str, Any]:
    """What the orchestrator and its consumers share (no Redis round trips)."""
    return {"ready": ctx.Value("i", 0), "done": ctx.Value("i", 0),
            "work_ms": ctx.Value("d", work_ms), "go": ctx.Event(), "stop": ctx.Event()}


def fresh(key: str, sock: str, name: str) -> Any:
    """A flushed Redis with ``key``'s keys set up; a connection to it named ``name``."""
    proto = PROTOCOLS[key](sock, name)
    proto.r.flushall()
    proto.setup()
    return proto


def redis_figures(r: Any) -> tuple[dict[str, int], float]:
    """(calls by command, CPU seconds) since the last ``CONFIG RESETSTAT``."""
    stats = r.info("commandstats")
    cpu = r.info("cpu")
    calls = {name[8:]: value["calls"] for name, value in stats.items() if name not in IGNORED}
    return calls, cpu["used_cpu_user"] + cpu["used_cpu_sys"]


def throughput(key: str, sock: str, state: Path, args: argparse.Namespace, ctx: Any,
               shared: dict[str, Any], results: Any) -> tuple[dict[str, Any], list[Any]]:
    """Producers and consumers on ``key``; its figures and the consumers (left running)."""
    proto = fresh(key, sock, "orchestrator")
    jobs = [f"{LANES[n % 3]}-{n}" for n in range(args.jobs)]
    consumers = [ctx.Process(target=consume, args=(key, sock, f"w{i}", str(state / f"{key}w{i}"),
                                                   shared, results)) for i in range(args.consumers)]
    producers = [ctx.Process(target=produce, args=(key, sock, f"p{i}", jobs[i::args.producers],
                                                   shared["ready"], shared["go"]))
                 for i in range(args.producers)]
    for process in consumers + producers:
        process.start()
    until(lambda: shared["ready"].value == len(consumers) + len(producers), "processes to start",
          consumers)
    proto.r.config_resetstat()
    cpu_before = redis_figures(proto.r)[1]
    began = time.perf_counter()
    shared["go"].set()
    until(lambda: shared["done"].value >= args.jobs, f"{key}: every job acked", consumers)
    elapsed = time.perf_counter() - began
    calls, cpu_after = redis_figures(proto.r)
    for process in producers:
        process.join()
    return {"acked": shared["done"].value, "jobs_per_s": args.jobs / elapsed,
            "commands_per_job": sum(calls.values()) / args.jobs,
            "commands": {name: round(n / args.jobs, 3) for name, n in sorted(calls.items())},
            "redis_cpu_us_per_job": 1e6 * (cpu_after - cpu_before) / args.jobs}, consumers


def probe(key: str, sock: str, args: argparse.Namespace, shared: dict[str, Any],
          results: Any) -> dict[str, float]:
    """A fast job published behind ``backlog`` relaxed ones: its wait (ms) and the
    relaxed jobs still queued when it was published."""
    proto = PROTOCOLS[key](sock, "prober")
    before = shared["done"].value
    proto.publish_many(("relaxed", f"relaxed-b{n}", body_of(f"relaxed-b{n}", "relaxed"))
                       for n in range(args.backlog))
    ahead = args.backlog - (shared["done"].value - before)
    proto.publish("fast", "fast-probe", body_of("fast-probe", "fast", probe=True))
    kind, wait_s = results.get(timeout=WAIT_S)
    until(lambda: shared["done"].value >= before + args.backlog + 1, f"{key}: the backlog")
    return {"wait_ms": 1000 * wait_s, "ahead": ahead}


def stop(consumers: list[Any], shared: dict[str, Any], results: Any) -> list[float]:
    """Stop the consumers; every take-to-ack time they saw (seconds)."""
    shared["stop"].set()
    latencies: list[float] = []
    for _ in consumers:
        kind, values = results.get(timeout=WAIT_S)
        latencies += values
    for process in consumers:
        process.join()
    return latencies


def one_kill(key: str, sock: str, state: Path, ctx: Any, round_: int) -> dict[str, Any]:
    """Publish, start one consumer, SIGKILL it while it holds a job; orphans before and
    after recovery."""
    proto = fresh(key, sock, "crash")
    ids = [f"{LANES[n % 3]}-x{n}" for n in range(CRASH_JOBS)]
    proto.publish_many((job.split("-")[0], job, body_of(job, job.split("-")[0])) for job in ids)
    shared, results, done_path = shared_state(ctx, 1.0), ctx.Queue(), state / f"{key}dead{round_}"
    victim = ctx.Process(target=consume, args=(key, sock, f"dead{round_}", str(done_path),
                                               shared, results))
    victim.start()
    until(lambda: shared["ready"].value == 1, "the victim to start", [victim])
    shared["go"].set()
    goal = random.randint(2, CRASH_JOBS // 2)
    until(lambda: shared["done"].value >= goal, "the victim to take jobs", [victim])
    time.sleep(random.uniform(0, KILL_SPREAD_S))  #: around its next take, or while it runs
    os.kill(victim.pid, signal.SIGKILL)
    victim.join()
    missing = set(ids) - set(done_path.read_text().split())
    orphans = missing - proto.located()
    recovered = proto.recover(f"dead{round_}")
    return {"unfinished": len(missing), "orphans": len(orphans), "recovered": recovered,
            "lost_after_recovery": len(missing - proto.located())}


def cpu_s(pid: int) -> float:
    """CPU seconds (user + system, every thread) process ``pid`` has used so far."""
    fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def pickup(proto: Any, results: Any, n: int, gap_ms: float) -> float:
    """One fast job, published ``gap_ms`` after the last one was taken (the consumer
    is idle): its publish-to-take, ms."""
    time.sleep(gap_ms / 1000)
    proto.publish("fast", f"fast-i{n}", body_of(f"fast-i{n}", "fast", probe=True))
    kind, wait_s = results.get(timeout=WAIT_S)
    return 1000 * wait_s


def idle_load(proto: Any, pid: int, seconds: float) -> dict[str, float]:
    """Over ``seconds`` with nothing published: consumer ``pid``'s CPU (% of a core)
    and the commands Redis ran per second."""
    proto.r.config_resetstat()
    cpu_before, began = cpu_s(pid), time.perf_counter()
    time.sleep(seconds)
    elapsed = time.perf_counter() - began
    calls = sum(redis_figures(proto.r)[0].values())
    return {"idle_cpu_pct": 100 * (cpu_s(pid) - cpu_before) / elapsed,
            "idle_redis_cmds_per_s": calls / elapsed}


def idle(key: str, sock: str, state: Path, args: argparse.Namespace, ctx: Any) -> dict[str, Any]:
    """One consumer, idle between ``--pickups`` single fast jobs (publish to take), then
    idle ``--idle-s`` with nothing published."""
    proto, shared, results = fresh(key, sock, "idler"), shared_state(ctx), ctx.Queue()
    consumer = ctx.Process(target=consume, args=(key, sock, "idle", str(state / f"{key}idle"),
                                                 shared, results))
    consumer.start()
    until(lambda: shared["ready"].value == 1, "the idle consumer to start", [consumer])
    shared["go"].set()
    # the first job finds the consumer still connecting and declaring: not counted
    waits = [pickup(proto, results, n, args.pickup_gap_ms) for n in range(args.pickups + 1)][1:]
    time.sleep(args.pickup_gap_ms / 1000)
    load = idle_load(proto, consumer.pid, args.idle_s)
    stop([consumer], shared, results)
    return {"idle_pickup_p50_ms": percentile(waits, 0.5),
            "idle_pickup_p99_ms": percentile(waits, 0.99), **load}


def crash(key: str, sock: str, state: Path, args: argparse.Namespace, ctx: Any) -> dict[str, Any]:
    """``--kills`` kills; totals."""
    kills = [one_kill(key, sock, state, ctx, n) for n in range(args.kills)]
    return {"kills": len(kills), **{field: sum(k[field] for k in kills) for field in kills[0]}}


def run_protocol(key: str, sock: str, state: Path, args: argparse.Namespace) -> dict[str, Any]:
    """Every figure of one protocol."""
    ctx = mp.get_context("spawn")
    shared, results = shared_state(ctx), ctx.Queue()
    figures, consumers = throughput(key, sock, state, args, ctx, shared, results)
    shared["work_ms"].value = args.work_ms
    probes = [probe(key, sock, args, shared, results) for _ in range(args.probes)]
    latencies = stop(consumers, shared, results)
    return {"protocol": PROTOCOLS[key].name, **figures,
            "take_to_ack_p50_ms": 1000 * percentile(latencies, 0.5),
            "take_to_ack_p99_ms": 1000 * percentile(latencies, 0.99),
            "fast_wait_ms": statistics.median(p["wait_ms"] for p in probes),
            "fast_wait_max_ms": max(p["wait_ms"] for p in probes),
            "relaxed_ahead": statistics.median(p["ahead"] for p in probes),
            **idle(key, sock, state, args, ctx), "crash": crash(key, sock, state, args, ctx)}


def benchmark(args: argparse.Namespace, state: Path) -> dict[str, Any]:
    """Start the private Redis, run every protocol, stop it."""
    from gpu_worker.redis_server import EmbeddedRedis

    server = EmbeddedRedis(state / "redis", extra_args=["--appendonly", "no"]).start()
    try:
        rows = []
        for key in args.protocols:
            print(f"  {PROTOCOLS[key].name} ...", file=sys.stderr, flush=True)
            rows.append(run_protocol(key, str(server.socket), state, args))
    finally:
        server.stop()
    config = {name: getattr(args, name) for name in
              ("jobs", "producers", "consumers", "backlog", "probes", "work_ms", "kills",
               "pickups", "pickup_gap_ms", "idle_s")}
    return {"config": {**config, "crash_jobs": CRASH_JOBS, "aof": "off"}, "summary": rows}


def table(rows: list[dict[str, Any]]) -> str:
    """The markdown table printed at the end."""
    return markdown_table(
        ["protocol", "jobs/s", "Redis cmds/job", "Redis CPU µs/job", "take→ack p50 ms",
         "take→ack p99 ms", "fast job behind backlog: wait ms (median / max)",
         "idle pickup p50 / p99 ms", "idle CPU % of a core", "idle Redis cmds/s",
         "kills", "orphans after kill", "recovered"],
        [[r["protocol"], f"{r['jobs_per_s']:,.0f}", f"{r['commands_per_job']:.2f}",
          f"{r['redis_cpu_us_per_job']:.1f}", f"{r['take_to_ack_p50_ms']:.3f}",
          f"{r['take_to_ack_p99_ms']:.3f}",
          f"{r['fast_wait_ms']:.1f} / {r['fast_wait_max_ms']:.1f}",
          f"{r['idle_pickup_p50_ms']:.2f} / {r['idle_pickup_p99_ms']:.2f}",
          f"{r['idle_cpu_pct']:.2f}", f"{r['idle_redis_cmds_per_s']:.1f}", r["crash"]["kills"],
          r["crash"]["orphans"], r["crash"]["recovered"]] for r in rows])


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """The command line; ``--quick`` shrinks every count."""
    parser = argparse.ArgumentParser(prog="python benchmarks/protocols.py", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="a few seconds: small counts")
    parser.add_argument("--protocols", default="abckg", help="which to run (default: abckg)")
    for name, default, kind in (("jobs", 20000, int), ("producers", 2, int),
                                ("consumers", 4, int), ("backlog", 1000, int),
                                ("probes", 3, int), ("work-ms", 1.0, float), ("kills", 10, int),
                                ("pickups", 200, int), ("pickup-gap-ms", 20.0, float),
                                ("idle-s", 5.0, float)):
        parser.add_argument(f"--{name}", type=kind, default=None,
                            help=f"(default: {default})")
    json_option(parser, "protocols")
    args = parser.parse_args(argv)
    quick = {"jobs": 600, "producers": 1, "consumers": 2, "backlog": 200, "probes": 1,
             "work_ms": 1.0, "kills": 1, "pickups": 20, "pickup_gap_ms": 20.0, "idle_s": 0.5}
    full = {"jobs": 20000, "producers": 2, "consumers": 4, "backlog": 1000, "probes": 3,
            "work_ms": 1.0, "kills": 10, "pickups": 200, "pickup_gap_ms": 20.0, "idle_s": 5.0}
    for name, value in (quick if args.quick else full).items():
        if getattr(args, name) is None:
            setattr(args, name, value)
    if set(args.protocols) - set(PROTOCOLS) or min(args.jobs, args.producers, args.consumers,
                                                   args.probes, args.kills, args.pickups) < 1:
        parser.error("--protocols takes letters of abckg; counts must be >= 1")
    return args


def main(argv: list[str] | None = None) -> int:
    """Run the benchmark, print the table; 130 after Ctrl-C."""
    args = parse_args(argv)
    report = run_private("gl-proto-", lambda state: benchmark(args, state),
                         "the private Redis is stopped")
    if report is None:
        return 130
    print(table(report["summary"]))
    print(f"{args.jobs} jobs, {args.producers} producer(s), {args.consumers} consumer(s); "
          f"commands per job count each command a Lua script calls; total wall time "
          f"{report['wall_s']:.1f}s")
    write_json(args.json, report)
    return 0


if __name__ == "__main__":
    sys.exit(main())
