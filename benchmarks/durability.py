"""What it costs a submit that Redis writes each accepted job to disk before it answers.

With ``appendfsync everysec`` Redis answers a publish once the write is in its AOF
buffer and fsyncs a second later; a crash in that second, or a write it postponed
behind a slow fsync, loses jobs it had accepted. With ``appendfsync always`` it
fsyncs before it answers (one fsync for every client served in the same turn of its
loop). With ``GPULANES_REDIS_REPLICAS=1`` a submit also waits until a replica holds
the job (``WAIT``): what a Sentinel failover needs to lose nothing.
``python benchmarks/durability.py`` starts one embedded Redis of each kind (the
last with a replica), in folders on the same disk, and in interleaved rounds has one
process per kind call ``submit()`` ``--jobs`` times from ``--threads`` threads (no
workers: nothing consumes). It prints jobs/s and the wall time per call for each,
and each kind's throughput over ``everysec``'s (the median of the per-round ratios,
so a slow stretch of the machine hits all alike).
Then it SIGKILLs each Redis right after a burst of accepted submits, restarts it from
its AOF and counts the accepted jobs that are not there: ``--json`` writes it all.
"""
from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
from pathlib import Path
from typing import Any

if not __package__:  # run as a script: make the project importable
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from benchmarks.common import (  # noqa: E402
    ROOT,
    free_port,
    json_option,
    markdown_table,
    state_dir,
    write_json,
)
from gpu_worker.redis_server import EmbeddedRedis  # noqa: E402

#: Each kind: its ``appendfsync`` and the replicas that confirm each accepted job.
KINDS = {"everysec": ("everysec", 0), "always": ("always", 0),
         "always, 1 replica (WAIT)": ("always", 1)}
POLICIES = tuple(KINDS)
#: The child that submits: ``jobs`` submits from ``threads`` threads; prints its timing.
SUBMITTER = """
import json, sys, time, threading
from tasks import submit
jobs, threads = int(sys.argv[1]), int(sys.argv[2])
ids, took, lock = [], [], threading.Lock()
def run(n):
    for i in range(n):
        began = time.perf_counter()
        result = submit("durability", steps=2, width=64, height=64)
        with lock:
            took.append(time.perf_counter() - began)
            ids.append(result.id)
began = time.perf_counter()
workers = [threading.Thread(target=run, args=(jobs // threads,)) for _ in range(threads)]
[w.start() for w in workers]
[w.join() for w in workers]
print(json.dumps({"wall_s": time.perf_counter() - began, "took": took, "ids": ids}))
"""


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=600)
    parser.add_argument("--threads", type=int, default=4)
    parser.add_argument("--rounds", type=int, default=5)
    json_option(parser, "durability")
    return parser.parse_args(argv)


def start(folder: Path, kind: str) -> list[EmbeddedRedis]:
    """An embedded Redis in ``folder`` that fsyncs its AOF as ``kind`` says, and the
    replicas ``kind`` asks for (each in a folder of its own)."""
    policy, replicas = KINDS[kind]
    primary = EmbeddedRedis(folder, port=free_port() if replicas else 0,
                            extra_args=["--appendfsync", policy]).start()
    servers = [primary]
    for index in range(replicas):
        servers.append(EmbeddedRedis(folder.with_name(f"{folder.name}-replica{index}"),
                                     port=free_port(), extra_args=[
                                         "--appendfsync", policy, "--replicaof", "127.0.0.1",
                                         str(primary.port)]).start())
    return servers


def submit_burst(servers: list[EmbeddedRedis], jobs: int, threads: int) -> dict[str, Any]:
    """``jobs`` submits to ``servers[0]`` from a process of its own (confirmed by the
    replicas among ``servers``): its timing and the ids."""
    server = servers[0]
    env = {**os.environ, "GPULANES_BROKER_URL": server.url, "GPULANES_DEVICE": "cpu",
           "GPULANES_CACHE": "off", "PYTHONPATH": str(ROOT),
           "GPULANES_REDIS_REPLICAS": str(len(servers) - 1)}
    out = subprocess.run([sys.executable, "-c", SUBMITTER, str(jobs), str(threads)],
                         env=env, capture_output=True, text=True, check=True, timeout=600)
    return json.loads(out.stdout.splitlines()[-1])


def lost_after_kill(servers: list[EmbeddedRedis], jobs: int, threads: int) -> int:
    """Accepted jobs missing once Redis, SIGKILLed right after a burst of submits, is
    back from its AOF (each job's message holds its id)."""
    burst, server = submit_burst(servers, jobs, threads), servers[0]
    os.kill(server.process.pid, signal.SIGKILL)
    server.process.wait()
    server.start()
    client = server.client()
    queued = b"".join(b"".join(client.lrange(key, 0, -1))
                      for key in client.scan_iter(_type="list"))  # every lane's lists
    return sum(job_id.encode() not in queued for job_id in burst["ids"])


def measure(args: argparse.Namespace, root: Path) -> dict[str, Any]:
    servers = {kind: start(root / f"kind{i}", kind) for i, kind in enumerate(POLICIES)}
    try:
        submit_burst(servers["always"], args.threads * 10, args.threads)  # warm the disk
        rounds = []
        for i in range(args.rounds):
            order = POLICIES if i % 2 == 0 else POLICIES[::-1]
            rounds.append({p: submit_burst(servers[p], args.jobs, args.threads) for p in order})
            for kind in servers.values():
                kind[0].client().flushall()
        lost = {p: lost_after_kill(servers[p], args.jobs, args.threads) for p in POLICIES}
    finally:
        for kind in servers.values():
            for server in reversed(kind):
                server.stop()
    return summary(rounds, lost, args)


def summary(rounds: list[dict], lost: dict[str, int], args: argparse.Namespace) -> dict:
    rows = {}
    for policy in POLICIES:
        took = [t for r in rounds for t in r[policy]["took"]]
        wall = sum(r[policy]["wall_s"] for r in rounds)
        rows[policy] = {"jobs_per_s": round(len(took) / wall, 1),
                        "p50_ms": round(statistics.median(took) * 1000, 2),
                        "p99_ms": round(statistics.quantiles(took, n=100)[98] * 1000, 2),
                        "lost_after_kill": lost[policy]}
    ratios = {p: round(statistics.median(r["everysec"]["wall_s"] / r[p]["wall_s"]
                                         for r in rounds), 3) for p in POLICIES[1:]}
    return {"jobs": args.jobs, "threads": args.threads, "rounds": args.rounds,
            "policies": rows, "throughput_over_everysec": ratios}


def report(figures: dict[str, Any]) -> None:
    rows = [(p, r["jobs_per_s"], r["p50_ms"], r["p99_ms"], r["lost_after_kill"])
            for p, r in figures["policies"].items()]
    print(markdown_table(("appendfsync", "submits/s", "p50 ms", "p99 ms",
                          "accepted jobs lost to a SIGKILL"), rows))
    for kind, ratio in figures["throughput_over_everysec"].items():
        print(f"\nthroughput with {kind} over everysec: {ratio}x ({figures['threads']} "
              f"threads, {figures['jobs']} jobs x {figures['rounds']} rounds)")


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    with state_dir("gl-durable-") as root:
        figures = measure(args, root)
    report(figures)
    write_json(args.json, figures)
    # ``always`` is the embedded default: it must keep every job it accepted
    return 1 if any(row["lost_after_kill"] for kind, row in figures["policies"].items()
                    if KINDS[kind][0] == "always") else 0


if __name__ == "__main__":
    sys.exit(main())
