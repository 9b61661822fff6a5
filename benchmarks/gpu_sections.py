"""The sections of ``benchmarks/gpu.py``, each a dict of figures with ``ok`` (did the
path do what it must) and ``device`` (where it really ran). Jobs run on a one-worker
cluster already started; nothing here imports ``tasks`` at module level."""
from __future__ import annotations

import statistics
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from benchmarks.batching import stream
from benchmarks.common import PROMPT, JobSize

#: What a job of the check model's own sections is (64 px: its size is not the point).
TINY_JOB = dict(steps=2, width=64, height=64)
TIMEOUT_S = 300.0


@dataclass(frozen=True)
class Sizes:
    """How big each section runs: the full check, or ``--tiny`` (a CPU in seconds)."""

    shard_mb: float  #: each of the 7 shards
    jobs: int  #: per batching setting
    batch: int  #: the batched worker's max_batch
    job: JobSize  #: the batching jobs'
    relaxed_steps: int  #: the preempted job's steps, each of ``pace_ms``
    pace_ms: int


FULL = Sizes(shard_mb=256.0, jobs=256, batch=8, job=JobSize(20, 256), relaxed_steps=40,
             pace_ms=100)
TINY = Sizes(shard_mb=0.25, jobs=16, batch=4, job=JobSize(4, 64), relaxed_steps=24,
             pace_ms=100)


# --- no cluster --------------------------------------------------------------------------
def shards(root: Path, device: str, shard_mb: float) -> dict[str, Any]:
    """A 7-shard checkpoint (``benchmarks/coldstart.py``'s) loaded onto ``device`` one
    shard at a time and 8 at once, each verified; the tensors land on the device and
    equal a load to the CPU."""
    import torch

    from benchmarks.coldstart import SHARDS, publish
    from gpu_worker.shards import load_checkpoint_timed

    publish(root, shard_mb)
    path = root / "published" / "bench"
    reference, _ = load_checkpoint_timed(path, "cpu")
    _, serial_ms = load_checkpoint_timed(path, device, max_workers=1)
    loaded, parallel_ms = load_checkpoint_timed(path, device, max_workers=8)
    places = sorted({str(tensor.device) for tensor in loaded.values()})
    same = all(torch.equal(loaded[name].cpu(), tensor) for name, tensor in reference.items())
    del loaded
    if torch.device(device).type == "cuda":
        torch.cuda.empty_cache()
    return {"ok": places == [device] and same, "device": ",".join(places), "shards": SHARDS,
            "shard_mb": shard_mb, "serial_ms": round(serial_ms, 1),
            "parallel_ms": round(parallel_ms, 1), "equal_to_cpu_load": same}


# --- on the cluster ----------------------------------------------------------------------
def pinning(app: Any, device: str) -> dict[str, Any]:
    """The worker's device (``device``: ``cuda:0`` or ``cpu``), the CUDA devices its
    process may see, and where jobs ran."""
    from routing.names import STATS_COMMAND
    from tasks import submit

    answers = app.control.broadcast(STATS_COMMAND, reply=True, timeout=2.0) or []
    stats = [reply for answer in answers for reply in answer.values()]
    ran = {submit(f"{PROMPT} {i}", seed=i, **TINY_JOB).get(timeout=TIMEOUT_S)["device"]
           for i in range(3)}
    pinned = stats[0]["device"] if stats else None
    env = process_env(stats[0]["pid"]) if stats else {}
    narrowed = device == "cpu" or env.get("CUDA_VISIBLE_DEVICES") is not None  # one GPU seen
    return {"ok": pinned == device and ran == {device} and narrowed
            and env.get("GPULANES_WORKER_DEVICE") == device, "device": pinned,
            "workers": len(stats), "job_devices": sorted(ran), "worker_env": env}


def process_env(pid: int) -> dict[str, str]:
    """The device pins in a process' environment (Linux ``/proc``; {} elsewhere)."""
    try:
        raw = Path(f"/proc/{pid}/environ").read_bytes()
    except OSError:
        return {}
    pairs = dict(item.split("=", 1) for item in raw.decode(errors="replace").split("\0")
                 if "=" in item)
    return {k: pairs[k] for k in ("CUDA_VISIBLE_DEVICES", "GPULANES_WORKER_DEVICE")
            if k in pairs}


def cold_warm(job: JobSize) -> dict[str, Any]:
    """The first job of a model the worker has not loaded (its shards read onto the
    device, the model warmed), then a second one on it warm."""
    from tasks import submit

    shape = dict(steps=job.steps, width=job.size, height=job.size)
    cold, warm = (submit(PROMPT, model="cold", seed=seed, **shape).get(timeout=TIMEOUT_S)
                  for seed in (1, 2))
    kept = ("cold_start", "load_ms", "run_ms", "queued_ms")
    return {"ok": cold["cold_start"] and not warm["cold_start"] and cold["load_ms"] > 0,
            "device": cold["device"], "cold": {k: cold[k] for k in kept},
            "warm": {k: warm[k] for k in kept}}


def throughput(job: JobSize, jobs: int, first_seed: int) -> dict[str, Any]:
    """Jobs/s of ``jobs`` seeded demo jobs published at once (``benchmarks/batching.py``'s
    stream), after a warm-up round; the batch sizes the results report."""
    from celery.result import ResultSet

    ResultSet(stream(8, job, first_seed=first_seed + 10**6)).get(timeout=TIMEOUT_S)
    began = time.monotonic()
    done = ResultSet(stream(jobs, job, first_seed=first_seed)).get(timeout=TIMEOUT_S)
    wall_s = time.monotonic() - began
    return {"device": done[0]["device"], "jobs": len(done), "wall_s": round(wall_s, 2),
            "jobs_per_s": round(len(done) / wall_s, 2),
            "mean_batch": round(statistics.fmean(r["batch_size"] for r in done), 2)}


def batching(single: dict[str, Any], batched: dict[str, Any], batch: int) -> dict[str, Any]:
    """Dynamic batching against single jobs: the same stream on the worker without, then
    with ``max_batch`` ``batch``."""
    return {"ok": single["mean_batch"] == 1 and batched["mean_batch"] > 1,
            "device": batched["device"], "max_batch": batch, "single": single,
            "batched": batched, "seconds": round(single["seconds"] + batched["seconds"], 1),
            "speedup": round(batched["jobs_per_s"] / single["jobs_per_s"], 2)}


def oom(single: dict[str, Any], batch: dict[str, Any]) -> dict[str, Any]:
    """Out of device memory: a job that never fits, then a batched pass that does not;
    real on CUDA, simulated on the CPU (``benchmarks/gpu_model.py``)."""
    how = ("real: allocations past the device's free memory" if batch["device"] != "cpu"
           else "simulated: the check model raises torch.cuda.OutOfMemoryError on the CPU")
    return {"ok": single["ok"] and batch["ok"], "device": batch["device"], "how": how,
            "seconds": round(single["seconds"] + batch["seconds"], 1), "single": single,
            "batch": batch}


def preemption(sizes: Sizes) -> dict[str, Any]:
    """A relaxed job of ``relaxed_steps`` paced steps, and a fast job published once it
    runs: the relaxed run steps aside at a step boundary (its latents kept on the
    device), the fast job runs, the relaxed one resumes where it stopped."""
    from tasks import submit

    relaxed = submit(f"pace:{sizes.pace_ms} a long relaxed job", model="check", seed=1,
                     tier="relaxed", steps=sizes.relaxed_steps, width=64, height=64)
    deadline = time.monotonic() + TIMEOUT_S
    while relaxed.state != "PROGRESS" and time.monotonic() < deadline:
        time.sleep(0.02)  # the run's first step report: it is on the device now
    fast = submit("an urgent job", model="check", seed=2, tier="fast", **TINY_JOB)
    urgent, long = fast.get(timeout=TIMEOUT_S), relaxed.get(timeout=TIMEOUT_S)
    return {"ok": long["preempted"] >= 1 and urgent["lane"] == "fast",
            "device": long["device"], "step_ms": sizes.pace_ms,
            "fast_wait_ms": urgent["queued_ms"],
            "fast_wait_steps": round(urgent["queued_ms"] / sizes.pace_ms, 2),
            "relaxed_preempted": long["preempted"], "relaxed_run_ms": long["run_ms"]}


def oom_single() -> dict[str, Any]:
    """A job whose pass claims twice the memory free at load: out of memory on every
    try (retried as a transient error, then failed); the next job, which fits, runs on
    the same worker."""
    from tasks import submit
    from tasks.broker.app import redis_client
    from tasks.broker.keys import attempts_key

    too_big = submit("claim:2 more than the card holds", model="check", seed=3, **TINY_JOB)
    too_big.get(timeout=TIMEOUT_S, propagate=False)
    after = submit("claim:0.2 a job that fits", model="check", seed=4,
                   **TINY_JOB).get(timeout=TIMEOUT_S)
    error = too_big.info
    return {"ok": too_big.state == "FAILURE" and "out of memory" in str(error).lower(),
            "device": after["device"], "too_big": {
                "state": too_big.state, "runs": int(redis_client().get(
                    attempts_key(too_big.id)) or 0), "error": f"{type(error).__name__}: "
                f"{str(error)[:200]}"}, "after": {"state": "SUCCESS", "attempts":
                                                   after["attempts"]}}


def oom_batch() -> dict[str, Any]:
    """Four jobs that claim 0.3 of the free memory each, held for one pass of four: it
    runs out of memory, and the batcher runs them again in halves of two, which fit;
    each job done on its first try."""
    from tasks import submit

    jobs = [submit(f"claim:0.3 a batched job {i}", model="check", seed=10 + i, **TINY_JOB)
            for i in range(4)]
    done = [job.get(timeout=TIMEOUT_S) for job in jobs]
    sizes = sorted(result["batch_size"] for result in done)
    return {"ok": sizes == [2, 2, 2, 2] and all(r["attempts"] == 1 for r in done),
            "device": done[0]["device"], "batch_sizes": sizes,
            "attempts": [r["attempts"] for r in done]}
