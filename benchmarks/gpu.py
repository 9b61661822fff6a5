"""A prepared GPU check: the CUDA path end to end on one GPU, in a few minutes.

``python benchmarks/gpu.py [--device auto|cuda|cpu] [--tiny]`` runs, on the device:

1. **shards**: a 7-shard checkpoint loaded onto the device, one shard at a time and
   in parallel, verified, equal to a load to the CPU (no cluster);
2. **pinning**: a private cluster of one worker (``python -m gpu_worker``): the
   device the worker reports, the CUDA devices its process may see, where jobs ran;
3. **cold_warm**: the first job of a model the worker has not loaded, then a warm one;
4. **preemption**: a fast job published while a relaxed one runs: the relaxed run
   steps aside at a step boundary and resumes after it;
5. **oom**: out of device memory, for real on CUDA (simulated on the CPU, as the
   tests do it: ``benchmarks/gpu_model.py``): a job that never fits fails after its
   retry and the worker serves on; a batched pass that does not fit is run again
   in halves, each job done on its first try;
6. **batching**: the same stream of jobs on the worker without, then with dynamic
   batching (the worker restarted with ``GPULANES_MAX_BATCH``).

Each section says where it ran (``device``) and whether the path did what it must
(``ok``); the figures go to the JSON. Exit status 1 when a section is not ok.
``--tiny`` is the small CPU form the test suite runs (seconds).
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Any, Callable

if not __package__:  # run as a script: make the project importable
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from benchmarks import gpu_sections as sections  # noqa: E402
from benchmarks.common import json_option, markdown_table, run_private, write_json  # noqa: E402

#: The models of the check's cluster: the demo, a demo model no worker warms, and
#: the check model (paced steps, device memory claims).
MODELS = ("demo=gpu_worker.demo_model:load,cold=gpu_worker.demo_model:load,"
          "check=benchmarks.gpu_model:load")
CLUSTER_ENV = {"MODELS": MODELS, "WARM_MODELS": "demo,check",
               "MAX_RETRIES": 1, "HEARTBEAT_S": 1}
SECTIONS = ("shards", "pinning", "cold_warm", "preemption", "oom", "batching")
#: How long the check model's first job of a pass waits for the others of its four.
CHECK_DELAY_MS = 2000


def timed(figures: dict[str, Any], name: str, run: Callable[[], dict[str, Any]]) -> None:
    """``figures[name] = run()``, with the seconds it took; a line on stderr."""
    began = time.monotonic()
    figures[name] = {**run(), "seconds": round(time.monotonic() - began, 1)}
    found = figures[name]
    verdict = "" if "ok" not in found else "ok, " if found["ok"] else "NOT ok, "
    print(f"  {name}: {verdict}{found['device']}, {found['seconds']:g}s", file=sys.stderr,
          flush=True)


def restart(cluster: Any, app: Any, env: dict[str, str]) -> None:
    """The cluster's worker again, with ``env`` added to its environment."""
    cluster.stop_workers()
    cluster.env = {**cluster.env, **env}
    cluster.start_workers()
    cluster.wait_for_workers(app, cluster.hostnames, 300)


def on_cluster(state: Path, device: str, sizes: sections.Sizes) -> dict[str, Any]:
    """Every part that needs a worker: first one job at a time, then with batching."""
    from tasks import app
    from tasks.dev.cluster import LocalCluster

    prebuild_cold(state)
    parts: dict[str, Any] = {}
    with LocalCluster(state, workers=1, device=device.split(":")[0], beat=False,
                      log_dir=state / "logs") as cluster:
        cluster.start(app, timeout_s=300, fresh=True)
        timed(parts, "pinning", lambda: sections.pinning(app, device))
        timed(parts, "cold_warm", lambda: sections.cold_warm(sizes.job))
        timed(parts, "preemption", lambda: sections.preemption(sizes))
        timed(parts, "oom_single", sections.oom_single)
        timed(parts, "single", lambda: sections.throughput(sizes.job, sizes.jobs, 0))
        restart(cluster, app, {
            "GPULANES_MAX_BATCH": f"demo={sizes.batch},check=4",
            "GPULANES_MAX_QUEUE_DELAY_MS": f"demo=10,check={CHECK_DELAY_MS}"})
        timed(parts, "oom_batch", sections.oom_batch)
        timed(parts, "batched", lambda: sections.throughput(sizes.job, sizes.jobs, 10**5))
    return parts


def prebuild_cold(state: Path) -> None:
    """The ``cold`` model's checkpoint, written beforehand: its cold start is a load."""
    from gpu_worker.demo_model import build_checkpoint

    build_checkpoint("cold", state / "models" / "cold")


def check(device: str, sizes: sections.Sizes, state: Path) -> dict[str, Any]:
    """Every section in turn; the figures by section, and the host's devices."""
    figures: dict[str, Any] = {}
    timed(figures, "shards", lambda: sections.shards(state / "store", device, sizes.shard_mb))
    parts = on_cluster(state, device, sizes)
    figures.update({name: parts[name] for name in ("pinning", "cold_warm", "preemption")})
    figures["oom"] = sections.oom(parts["oom_single"], parts["oom_batch"])
    figures["batching"] = sections.batching(parts["single"], parts["batched"], sizes.batch)
    return {"device": device, "host": host(), "sections": figures,
            "ran_on": {name: figures[name]["device"] for name in SECTIONS}}


def host() -> dict[str, Any]:
    """What torch sees of this host's devices."""
    import torch

    cuda = torch.cuda.is_available()
    return {"torch": torch.__version__, "cuda": torch.version.cuda,
            "gpus": torch.cuda.device_count() if cuda else 0,
            "gpu": torch.cuda.get_device_name(0) if cuda else None}


def report(found: dict[str, Any], tiny: bool) -> None:
    rows = [(name, "yes" if found["sections"][name]["ok"] else "NO",
             found["sections"][name]["device"], found["sections"][name]["seconds"])
            for name in SECTIONS]
    print(markdown_table(("section", "ok", "ran on", "seconds"), rows, "llll"))
    batching, pre = found["sections"]["batching"], found["sections"]["preemption"]
    print(f"\n{'tiny, ' if tiny else ''}{found['host']['gpu'] or 'no GPU'}; batching "
          f"{batching['speedup']}x the jobs/s of single jobs; a fast job waited "
          f"{pre['fast_wait_steps']} step times; {found['wall_s']:.0f}s in all")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python benchmarks/gpu.py", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", choices=("auto", "cuda", "cpu"), default="auto",
                        help="where to run (auto: cuda when a GPU is visible)")
    parser.add_argument("--tiny", action="store_true",
                        help="small sizes: the CPU form the test suite runs")
    json_option(parser, "gpu")
    return parser.parse_args(argv)


def resolve(asked: str) -> str:
    """The torch device to check: ``cuda:0`` (auto, when torch sees a GPU) or ``cpu``.
    (``gpu_worker.devices`` would load the settings before the cluster's are set.)"""
    import torch

    if asked != "cpu" and torch.cuda.is_available():
        return "cuda:0"
    if asked == "cuda":
        raise SystemExit("benchmarks/gpu.py: --device cuda, but torch sees no CUDA device")
    return "cpu"


def main(argv: list[str] | None = None) -> int:
    """Run the check; 0 when every section is ok, 1 when one is not, 130 after Ctrl-C."""
    args = parse_args(argv)
    device, sizes = resolve(args.device), sections.TINY if args.tiny else sections.FULL
    found = run_private("gl-gpu-", lambda state: check(device, sizes, state),
                        "the cluster is stopped", DEVICE=device.split(":")[0], **CLUSTER_ENV)
    if found is None:
        return 130
    found["tiny"] = args.tiny
    report(found, args.tiny)
    write_json(args.json, found)
    return 0 if all(found["sections"][name]["ok"] for name in SECTIONS) else 1


if __name__ == "__main__":
    sys.exit(main())
