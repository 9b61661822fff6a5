"""Cold start: 7 shards behind a slow HTTP store, loaded one by one or in parallel.

``python benchmarks/coldstart.py`` publishes a 7-shard safetensors checkpoint
to a folder, serves it over HTTP on 127.0.0.1 with a fixed latency added to
every request (a stand-in for an object store), and times a cold load (fetch
every shard into an empty cache, verify, load) with gpulanes' store and
loader at 1 worker thread (serial, what a plain loop does) and at 8 (its
default). The floor is what no loader can beat: the manifest read (it names
the shards, so it comes first) plus the largest shard, fetched alone. A warm
load (the cache already holds the shards) shows what a worker pays on a
second start on the same host.

Goal: parallel <= 1.3x the floor. (Against serial the floor itself is
2/8 of 8 round trips, so "<= 0.2x serial" cannot hold while a manifest
round trip comes first; the table shows both ratios.)
"""
from __future__ import annotations

import argparse
import functools
import json
import shutil
import statistics
import sys
import tempfile
import threading
import time
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Callable

if not __package__:  # run as a script: make the project importable
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.common import markdown_table  # noqa: E402

SHARDS = 7


class SlowHandler(SimpleHTTPRequestHandler):
    """Serves files after a fixed delay, like a distant object store."""

    latency_s = 0.0

    def do_GET(self) -> None:  # noqa: N802  http.server's naming
        time.sleep(self.latency_s)
        super().do_GET()

    def log_message(self, *args: object) -> None:
        pass


def publish(root: Path, shard_mb: float) -> None:
    """A 7-shard checkpoint of random tensors under ``root/bench``."""
    import torch

    from gpu_worker.shards import write_checkpoint

    per_shard = int(shard_mb * 2**20 / 4)
    gen = torch.Generator().manual_seed(0)
    tensors = {f"layer{i}.weight": torch.randn(per_shard, generator=gen) for i in range(SHARDS)}
    write_checkpoint(tensors, root / "bench", SHARDS)


def serve(root: Path, latency_s: float) -> tuple[ThreadingHTTPServer, str]:
    SlowHandler.latency_s = latency_s
    server = ThreadingHTTPServer(("127.0.0.1", 0),
                                 functools.partial(SlowHandler, directory=str(root)))
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server, f"http://127.0.0.1:{server.server_address[1]}"


def cold_load(url: str, workers: int, keep_cache: Path | None = None) -> float:
    """Seconds to fetch (into an empty cache unless ``keep_cache``), verify and load."""
    from gpu_worker.shards import load_checkpoint
    from gpu_worker.store import RemoteStore

    cache = keep_cache or Path(tempfile.mkdtemp(prefix="gl-cold-"))
    began = time.perf_counter()
    load_checkpoint(RemoteStore(url, cache, max_workers=workers).fetch("bench"), "cpu",
                    max_workers=workers, verify=False)  # fetch() verified every shard
    elapsed = time.perf_counter() - began
    if keep_cache is None:
        shutil.rmtree(cache, ignore_errors=True)
    return elapsed


def slowest_shard(url: str) -> float:
    """Seconds to read the manifest and fetch the largest shard: the floor of a load."""
    import fsspec

    fs, root = fsspec.core.url_to_fs(url)
    began = time.perf_counter()
    manifest = json.loads(fs.cat_file(f"{root}/bench/manifest.json"))
    shard = max(manifest["shards"], key=lambda s: s["size_bytes"])
    fs.cat_file(f"{root}/bench/{shard['file']}")
    return time.perf_counter() - began


def median_of(repeats: int, run: Callable[[], float]) -> float:
    return statistics.median(run() for _ in range(repeats))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--latency-ms", type=float, default=300.0,
                        help="delay the store adds to every request")
    parser.add_argument("--shard-mb", type=float, default=8.0)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args(argv)
    root = Path(tempfile.mkdtemp(prefix="gl-store-"))
    try:
        publish(root, args.shard_mb)
        server, url = serve(root, args.latency_ms / 1000)
        report(measure(url, args.repeats, root), args)
        server.shutdown()
    finally:
        shutil.rmtree(root, ignore_errors=True)
    return 0


def measure(url: str, repeats: int, root: Path) -> dict[str, float]:
    warm_cache = root / "warm-cache"
    cold_load(url, 8, keep_cache=warm_cache)  # fill it once
    return {"floor: manifest + largest shard": median_of(repeats, lambda: slowest_shard(url)),
            "serial (1 thread)": median_of(repeats, lambda: cold_load(url, 1)),
            "parallel (8 threads)": median_of(repeats, lambda: cold_load(url, 8)),
            "warm cache (8 threads)": median_of(repeats,
                                                lambda: cold_load(url, 8, warm_cache))}


def report(times: dict[str, float], args: argparse.Namespace) -> None:
    floor, serial = times["floor: manifest + largest shard"], times["serial (1 thread)"]
    rows = [(name, f"{t * 1000:.0f}", f"{t / floor:.2f}x", f"{t / serial:.2f}x")
            for name, t in times.items()]
    print(f"\n{SHARDS} shards of {args.shard_mb:g} MB, {args.latency_ms:g} ms added per "
          f"request, median of {args.repeats}\n")
    print(markdown_table(["load", "ms", "vs floor", "vs serial"], rows, "lrrr"))
    parallel = times["parallel (8 threads)"]
    print(f"\nparallel = {parallel / floor:.2f}x the floor (goal <= 1.3x: "
          f"{'met' if parallel <= 1.3 * floor else 'NOT met'}), {parallel / serial:.2f}x serial "
          f"(the floor alone is {floor / serial:.2f}x serial)")


if __name__ == "__main__":
    sys.exit(main())
