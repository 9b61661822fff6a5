"""Cold start: 7 shards behind a slow HTTP store, loaded one by one or in parallel.

``python benchmarks/coldstart.py`` publishes a 7-shard safetensors checkpoint
to a folder, serves it over HTTP on 127.0.0.1 with a fixed latency added to
every request (a stand-in for an object store), and times a cold load (fetch
every shard into an empty cache, verify, load) with gpulanes' store and
loader at 1 worker thread (serial, what a plain loop does) and at 8 (its
default), in two cases:

- the first load of the model in the cluster: the manifest (it names the
  shards) is read from the store first, then the shards;
- a load on another host afterwards (a new or restarted GPU worker): the
  manifest the cluster pinned in Redis is read instead, so the shards start
  at once (``gpu_worker.store.ManifestPins``; a real embedded Redis here).

The floors are what no loader can beat: the largest shard fetched alone
(plus the manifest read for a first load). A warm load (the host's cache
already holds the shards) shows what a worker pays on a second start.

Goal: parallel <= 1.3x the slowest shard, i.e. <= 0.2x serial (that ratio
holds only where no manifest read comes first: on another host).

No Celery on either side: this compares two ways of loading a checkpoint (one shard
after another, and in parallel) with gpulanes' own store and loader, not gpulanes
against plain Celery.
"""
from __future__ import annotations

import argparse
import functools
import json
import multiprocessing
import shutil
import statistics
import sys
import tempfile
import time
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, Callable

if not __package__:  # run as a script: make the project importable
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.common import json_option, markdown_table, write_json  # noqa: E402
from gpu_worker.redis_server import EmbeddedRedis  # noqa: E402
from gpu_worker.store import ManifestPins  # noqa: E402
from tasks.broker.keys import MANIFESTS_KEY  # noqa: E402

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
    write_checkpoint(tensors, root / "published" / "bench", SHARDS)


def _serve_forever(root: str, latency_s: float, port: Any) -> None:
    SlowHandler.latency_s = latency_s
    server = ThreadingHTTPServer(("127.0.0.1", 0),
                                 functools.partial(SlowHandler, directory=root))
    port.value = server.server_address[1]
    server.serve_forever()


def serve(root: Path, latency_s: float) -> tuple[multiprocessing.Process, str]:
    """The store in a process of its own, as a real one is: it never takes the loader's GIL."""
    spawn = multiprocessing.get_context("spawn")
    port = spawn.Value("i", 0)
    server = spawn.Process(
        target=_serve_forever, args=(str(root), latency_s, port), daemon=True)
    server.start()
    deadline = time.monotonic() + 30
    while not port.value and time.monotonic() < deadline:
        time.sleep(0.01)
    if not port.value:
        raise RuntimeError("the benchmark's HTTP store did not start")
    return server, f"http://127.0.0.1:{port.value}"


def cold_load(url: str, workers: int, pins: ManifestPins | None,
              keep_cache: Path | None = None) -> float:
    """Seconds to fetch (into an empty cache unless ``keep_cache``), verify and load."""
    from gpu_worker.shards import load_checkpoint
    from gpu_worker.store import RemoteStore

    cache = keep_cache or Path(tempfile.mkdtemp(prefix="gl-cold-"))
    began = time.perf_counter()
    store = RemoteStore(url, cache, max_workers=workers, pins=pins)
    load_checkpoint(store.fetch("bench"), "cpu", max_workers=workers,
                    verify=False)  # fetch() verified every shard
    elapsed = time.perf_counter() - began
    if keep_cache is None:
        shutil.rmtree(cache, ignore_errors=True)
    return elapsed


def first_load(url: str, workers: int, pins: ManifestPins) -> float:
    """A cold load with nothing pinned yet (it pins the manifest; dropped again after)."""
    pins.client.delete(MANIFESTS_KEY)
    return cold_load(url, workers, pins)


def slowest_shard(url: str, with_manifest: bool) -> float:
    """Seconds to fetch the largest shard (after reading the manifest, if asked)."""
    import fsspec

    fs, root = fsspec.core.url_to_fs(url)
    manifest = json.loads(fs.cat_file(f"{root}/bench/manifest.json"))
    shard = max(manifest["shards"], key=lambda s: s["size_bytes"])
    began = time.perf_counter()
    if with_manifest:
        fs.cat_file(f"{root}/bench/manifest.json")
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
    json_option(parser, "coldstart")
    args = parser.parse_args(argv)
    root = Path(tempfile.mkdtemp(prefix="gl-store-"))
    redis_server = EmbeddedRedis(root / "redis").start()
    try:
        publish(root, args.shard_mb)
        server, url = serve(root / "published", args.latency_ms / 1000)
        pins = ManifestPins(redis_server.client())
        times = measure(url, args.repeats, root, pins)
        report(times, args)
        write_json(args.json, {"shards": SHARDS, "shard_mb": args.shard_mb,
                               "latency_ms": args.latency_ms, "repeats": args.repeats,
                               "load_s": times})
        server.terminate()
    finally:
        redis_server.stop()
        shutil.rmtree(root, ignore_errors=True)
    return 0


def measure(url: str, repeats: int, root: Path, pins: ManifestPins) -> dict[str, float]:
    warm_cache = root / "warm-cache"
    times = {
        "first in cluster, floor: manifest + largest shard":
            median_of(repeats, lambda: slowest_shard(url, True)),
        "first in cluster, serial (1 thread)": median_of(repeats, lambda: first_load(url, 1, pins)),
        "first in cluster, parallel (8 threads)":
            median_of(repeats, lambda: first_load(url, 8, pins)),
    }
    cold_load(url, 8, pins, keep_cache=warm_cache)  # pins the manifest, fills the warm cache
    times.update({
        "another host, floor: largest shard": median_of(repeats, lambda: slowest_shard(url, False)),
        "another host, serial (1 thread)": median_of(repeats, lambda: cold_load(url, 1, pins)),
        "another host, parallel (8 threads)": median_of(repeats, lambda: cold_load(url, 8, pins)),
        "warm cache (8 threads)": median_of(repeats,
                                            lambda: cold_load(url, 8, pins, warm_cache)),
    })
    return times


def report(times: dict[str, float], args: argparse.Namespace) -> None:
    shard = times["another host, floor: largest shard"]
    rows = [(name, f"{t * 1000:.0f}", f"{t / shard:.2f}x") for name, t in times.items()]
    print(f"\n{SHARDS} shards of {args.shard_mb:g} MB, {args.latency_ms:g} ms added per "
          f"request, median of {args.repeats}\n")
    print(markdown_table(["load", "ms", "vs largest shard"], rows, "lrr"))
    for case, floor_name in (("another host", "another host, floor: largest shard"),
                             ("first in cluster",
                              "first in cluster, floor: manifest + largest shard")):
        parallel, serial = times[f"{case}, parallel (8 threads)"], times[f"{case}, serial (1 thread)"]
        floor = times[floor_name]
        verdict = "met" if parallel <= 1.3 * floor else "NOT met"
        print(f"\n{case}: parallel = {parallel / floor:.2f}x its floor (goal <= 1.3x: {verdict}),"
              f" {parallel / serial:.2f}x serial")


if __name__ == "__main__":
    sys.exit(main())
