"""The result cache and in-flight coalescing: a stream with repeats, cache off vs on.

``python benchmarks/cache.py`` (or ``make bench``) starts one local cluster (an
embedded Redis and ONE CPU worker, no beat) and sends the same request stream
twice, cache off and then on (``submit()`` reads ``GPULANES_CACHE`` per call,
and the off run leaves nothing behind in Redis or in the sightings):

- the stream: ``--requests`` seeded requests; each one, with probability
  ``--repeat`` (0.3), repeats an earlier request of the stream (picked
  uniformly over the requests so far, so popular requests come back more
  often), otherwise it is new. ``--in-flight`` requests are outstanding at a
  time, so a repeat of a request still queued or running joins its run;
- GPU runs: results made by a run of their own (``cached: false``), checked
  against the worker's own served counter; a request answered from the cache
  or by joining a run costs none. Admission is LRU-K with K=2, so the first
  repeat of a request is generated (and admitted); only later ones can hit.

Then, with the cache on and one request at a time (nothing queued), the
latency of a generation and of a hit, submit to ``.get()`` in the client:
``--samples`` new requests are each sent twice (two generations, the second
admitted), then each three more times (hits); the hits come after all the
generations, so none is timed while the worker is still wrapping up a job. Cache memory per entry: Redis ``MEMORY USAGE``
of every entry key, plus each entry's share of the LRU sorted set.
"""
from __future__ import annotations

import argparse
import random
import sys
import time
from pathlib import Path
from typing import Any

if not __package__:  # run as a script: make the project importable
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from benchmarks.common import (  # noqa: E402
    JobSize,
    check_size,
    finish,
    json_option,
    markdown_table,
    percentile,
    run_private,
)

ACCOUNT = "bench"
GOAL_RATIO = 100.0
#: Hits per latency probe (cheap, so more of them).
HIT_ROUNDS = 3


def make_stream(requests: int, repeat: float, seed: int) -> list[int]:
    """Request ids in arrival order; a repeat reuses the id of an earlier request."""
    rng, stream, distinct = random.Random(seed), [], 0
    for _ in range(requests):
        if stream and rng.random() < repeat:
            stream.append(rng.choice(stream))
        else:
            stream.append(distinct)
            distinct += 1
    return stream


def send(prompt: str, seed: int, size: JobSize) -> Any:
    from tasks import submit

    return submit(prompt, account=ACCOUNT, seed=seed, steps=size.steps,
                  width=size.size, height=size.size)


def served(app: Any) -> int:
    """Jobs the worker has run to success (its own counter)."""
    from routing.names import STATS_COMMAND

    (answer,) = app.control.broadcast(STATS_COMMAND, reply=True, timeout=2.0, limit=1)
    return next(iter(answer.values()))["served"]


def drive(stream: list[int], in_flight: int, size: JobSize) -> list[dict]:
    """Send the stream keeping ``in_flight`` requests outstanding; every result."""
    pending, done = [], []
    for request in stream:
        pending.append(send(f"scene {request}", request, size))
        while len(pending) >= in_flight:
            done.append(pending.pop(0).get(timeout=300))
    return done + [result.get(timeout=300) for result in pending]


def one_mode(on: bool, stream: list[int], args: argparse.Namespace, app: Any) -> dict:
    """The stream with the cache ``on`` or off: runs, hits, joins, worker runs, wall time."""
    from tasks.settings import settings

    settings.cache, before = on, served(app)
    began = time.monotonic()
    results = drive(stream, args.in_flight, JobSize(args.steps, args.size))
    wall_s = time.monotonic() - began
    runs = sum(not r["cached"] for r in results)
    deadline = time.monotonic() + 10  # the counter moves just after each result is stored
    while served(app) - before < runs and time.monotonic() < deadline:
        time.sleep(0.05)
    return {"requests": len(results), "gpu_runs": runs, "worker_runs": served(app) - before,
            "hits": sum(r["cached"] and not r.get("coalesced") for r in results),
            "joined": sum(bool(r.get("coalesced")) for r in results),
            "wall_s": wall_s}


def timed(prompt: str, seed: int, size: JobSize) -> tuple[float, dict]:
    began = time.perf_counter()
    out = send(prompt, seed, size).get(timeout=300)
    return (time.perf_counter() - began) * 1000, out


def latencies(samples: int, size: JobSize) -> dict[str, list[float]]:
    """One at a time: ``samples`` new requests, all sent twice (generated, then
    admitted), then all of them again ``HIT_ROUNDS`` times (hits)."""
    found: dict[str, list[float]] = {"generation": [], "hit": []}
    for i in list(range(samples)) * (2 + HIT_ROUNDS):
        ms, out = timed(f"latency probe {i}", i, size)
        found["hit" if out["cached"] else "generation"].append(ms)
    return found


def memory_per_entry() -> dict[str, float]:
    """Mean bytes of an entry key and its share of the LRU set (Redis MEMORY USAGE)."""
    from tasks.broker.app import redis_client
    from tasks.broker.keys import CACHE_LRU_KEY, cache_entry_key

    client = redis_client()
    keys = list(client.scan_iter(cache_entry_key("*")))
    entry = sum(client.memory_usage(key) for key in keys) / max(1, len(keys))
    lru = (client.memory_usage(CACHE_LRU_KEY) or 0) / max(1, client.zcard(CACHE_LRU_KEY))
    return {"entries": len(keys), "entry_bytes": entry, "lru_bytes": lru}


def benchmark(args: argparse.Namespace, state: Path) -> dict[str, Any]:
    """Start the cluster, both modes, then latency and memory with the cache on."""
    from tasks import app
    from tasks.dev.cluster import LocalCluster

    size = JobSize(args.steps, args.size)
    check_size("cache.py", size, ACCOUNT)
    stream = make_stream(args.requests, args.repeat, seed=args.seed)
    cluster = LocalCluster(state, workers=1, device="cpu", beat=False, log_dir=state / "logs")
    try:
        print("starting embedded Redis and one worker (cpu) ...", file=sys.stderr, flush=True)
        cluster.start(app)
        modes = {"cache off": one_mode(False, stream, args, app),
                 "cache on": one_mode(True, stream, args, app)}
        memory = memory_per_entry()
        latency = latencies(args.samples, size)
    finally:
        cluster.stop()
    return {"modes": modes, "latency_ms": latency, "memory": memory,
            "repeats": len(stream) - len(set(stream)), "distinct": len(set(stream))}


def report(figures: dict[str, Any], args: argparse.Namespace) -> None:
    """Print both tables and the verdict."""
    modes, latency, memory = figures["modes"], figures["latency_ms"], figures["memory"]
    print(f"\n{args.requests} requests ({figures['distinct']} distinct, {figures['repeats']} "
          f"repeats), {args.in_flight} in flight, one CPU worker, {args.steps} steps at "
          f"{args.size}x{args.size}\n")
    print(markdown_table(
        ["mode", "requests", "GPU runs", "served from cache", "joined a run in flight",
         "worker's own run count", "wall s"],
        [[mode, m["requests"], m["gpu_runs"], m["hits"], m["joined"], m["worker_runs"],
          f"{m['wall_s']:.1f}"] for mode, m in modes.items()]))
    off, on = modes["cache off"]["gpu_runs"], modes["cache on"]["gpu_runs"]
    print(f"\nGPU runs saved: {off - on} of {off} ({100 * (off - on) / off:.1f} %)\n")
    rows = [[kind, len(ms), f"{percentile(ms, 0.5):.2f}", f"{percentile(ms, 0.95):.2f}"]
            for kind, ms in latency.items()]
    print(markdown_table(["request (one at a time)", "n", "p50 ms", "p95 ms"], rows))
    ratio = percentile(latency["generation"], 0.5) / percentile(latency["hit"], 0.5)
    print(f"\na hit is {ratio:.0f}x faster than a generation at p50 (goal >= {GOAL_RATIO:g}x: "
          f"{'met' if ratio >= GOAL_RATIO else 'NOT met'})")
    print(f"cache memory: {memory['entries']} entries, {memory['entry_bytes']:.0f} B per entry "
          f"key + {memory['lru_bytes']:.0f} B in the LRU set = "
          f"{memory['entry_bytes'] + memory['lru_bytes']:.0f} B per entry; "
          f"total wall time {figures['wall_s']:.0f}s")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python benchmarks/cache.py", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--requests", type=int, default=300, help="requests in the stream")
    parser.add_argument("--repeat", type=float, default=0.3, help="share of repeats")
    parser.add_argument("--in-flight", type=int, default=4, help="requests outstanding")
    parser.add_argument("--samples", type=int, default=20, help="latency probes (each sent 2 + 3 times)")
    parser.add_argument("--steps", type=int, default=20, help="denoising steps per job")
    parser.add_argument("--size", type=int, default=256, help="image side in pixels")
    parser.add_argument("--seed", type=int, default=7, help="seed of the stream")
    json_option(parser, "cache")
    args = parser.parse_args(argv)
    if args.requests < 1 or args.in_flight < 1 or args.samples < 1 or not 0 <= args.repeat < 1:
        parser.error("--requests, --in-flight, --samples >= 1 and 0 <= --repeat < 1")
    return args


def main(argv: list[str] | None = None) -> int:
    """Run the benchmark and print its tables; 130 after Ctrl-C."""
    args = parse_args(argv)
    figures = run_private("gl-cache-", lambda state: benchmark(args, state),
                          "the cluster is stopped", CACHE="on")
    return finish(figures, lambda found: report(found, args), args.json)


if __name__ == "__main__":
    sys.exit(main())
