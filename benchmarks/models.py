"""Models of the class contract in the lanes: what a cache hit saves on a real model.

``python benchmarks/models.py`` starts a private cluster (an embedded Redis and ONE
CPU worker, no beat) serving a diffusers pipeline (a tiny Stable Diffusion built
from configs with random weights and saved with ``save_pretrained``: real diffusers
code, no download) and the built-in ``echo`` model, then, one request at a time:

- ``--samples`` new seeded text-to-image requests, each sent twice (two runs: the
  second is admitted to the cache, LRU-K) and then ``HIT_ROUNDS`` more times
  (hits), submit to ``.get()`` in the client; a hit of a deterministic model is
  keyed by the model's version and its validated inputs;
- the same for ``echo`` (a model that does nothing: the lanes' own cost per job).

It prints the p50/p95 latency of a run and of a hit per model, and the ratio of a
run to a hit (goal for a model with real work: >= 100x).
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Any

if not __package__:  # run as a script: make the project importable
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from benchmarks.common import finish, json_option, markdown_table, percentile, run_private  # noqa: E402

GOAL_RATIO = 100.0
HIT_ROUNDS = 3
MODELS = "tiny-sd=benchmarks.models:TinySd,echo=tasks.models.echo:Echo"


def _tiny_sd() -> type:
    from tasks.models.diffusion import Diffusion

    class TinySd(Diffusion):
        folder, version = "tiny-sd", "tiny-1"

    return TinySd


TinySd = _tiny_sd()


def call(model: str, i: int, args: argparse.Namespace) -> dict[str, Any]:
    if model == "echo":
        return dict(model="echo", text=f"probe {i}")
    return dict(model=model, prompt=f"probe {i}", seed=i, steps=args.steps,
                width=args.size, height=args.size)


def probe(model: str, args: argparse.Namespace) -> dict[str, list[float]]:
    """One at a time: each request twice (runs), then ``HIT_ROUNDS`` times (hits)."""
    from tasks import submit

    found: dict[str, list[float]] = {"run": [], "hit": []}
    for i in list(range(args.samples)) * (2 + HIT_ROUNDS):
        began = time.perf_counter()
        out = submit(**call(model, i, args)).get(timeout=300)
        found["hit" if out["cached"] else "run"].append((time.perf_counter() - began) * 1000)
    return found


def benchmark(args: argparse.Namespace, state: Path) -> dict[str, Any]:
    from tasks import app
    from tasks.dev.cluster import LocalCluster
    from tests.tiny_models import build_tiny_diffusion

    build_tiny_diffusion(state / "models" / "tiny-sd")
    cluster = LocalCluster(state, workers=1, device="cpu", beat=False, log_dir=state / "logs")
    try:
        print("starting embedded Redis and one worker (cpu) ...", file=sys.stderr, flush=True)
        cluster.start(app)
        probe("echo", argparse.Namespace(samples=1))  # the submit path warm, unrecorded
        return {"latency_ms": {model: probe(model, args) for model in ("tiny-sd", "echo")}}
    finally:
        cluster.stop()


def report(figures: dict[str, Any], args: argparse.Namespace) -> None:
    rows, ratios = [], {}
    for model, found in figures["latency_ms"].items():
        run, hit = percentile(found["run"], 0.5), percentile(found["hit"], 0.5)
        ratios[model] = run / hit
        rows.append([model, len(found["run"]), f"{run:.1f}",
                     f"{percentile(found['run'], 0.95):.1f}", len(found["hit"]), f"{hit:.2f}",
                     f"{percentile(found['hit'], 0.95):.2f}", f"{ratios[model]:.0f}x"])
    print(f"\none CPU worker; tiny-sd: {args.steps} steps at {args.size}x{args.size}\n")
    print(markdown_table(["model", "runs", "run p50 ms", "run p95 ms", "hits", "hit p50 ms",
                          "hit p95 ms", "run / hit"], rows))
    verdict = "met" if ratios["tiny-sd"] >= GOAL_RATIO else "NOT met"
    print(f"\na hit of tiny-sd is {ratios['tiny-sd']:.0f}x faster than its run at p50 "
          f"(goal >= {GOAL_RATIO:g}x: {verdict}); total wall time {figures['wall_s']:.0f}s")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python benchmarks/models.py", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--samples", type=int, default=10, help="distinct requests per model")
    parser.add_argument("--steps", type=int, default=10, help="tiny-sd denoising steps")
    parser.add_argument("--size", type=int, default=128, help="tiny-sd image side")
    json_option(parser, "models")
    args = parser.parse_args(argv)
    figures = run_private("gl-models-", lambda state: benchmark(args, state),
                          "the cluster is stopped", CACHE="on", MODELS=MODELS, WARM_MODELS="echo")
    return finish(figures, lambda found: report(found, args), args.json)


if __name__ == "__main__":
    sys.exit(main())
