"""``python -m gpu_worker --workers N --device auto|cpu|cuda``: see ``launcher``."""
from __future__ import annotations

import argparse
import logging
import sys

from gpu_worker.batching import CONCURRENCY_ENV, worker_concurrency
from gpu_worker.devices import gpu_count, resolve
from gpu_worker.launcher import Child, Supervisor, worker_command, worker_env
from gpu_worker.topology import cpus_for, gpus


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m gpu_worker", description=__doc__)
    parser.add_argument("--workers", type=int, default=None,
                        help="worker processes; default: one per GPU, or 1 on CPU")
    parser.add_argument("--device", choices=("auto", "cpu", "cuda"), default=None,
                        help="default: GPULANES_DEVICE (auto)")
    parser.add_argument("--concurrency", type=int, default=None,
                        help="jobs one worker holds at once (threads); default: the largest "
                             "GPULANES_MAX_BATCH, so 1 (one GPU, no batching) unless set")
    parser.add_argument("--loglevel", default="INFO")
    return parser.parse_args(argv)


def plan(args: argparse.Namespace) -> tuple[str, int]:
    """The device kind and the number of workers, checked against the host."""
    from tasks.settings import settings

    device = resolve(args.device or settings.device)
    if args.concurrency is not None and args.concurrency < 1:
        raise SystemExit("--concurrency must be at least 1")
    gpus = gpu_count() if device == "cuda" else 0
    workers = args.workers if args.workers is not None else max(gpus, 1)
    if workers < 1:
        raise SystemExit("--workers must be at least 1")
    if device == "cuda" and workers > gpus:
        raise SystemExit(f"--workers {workers} but only {gpus} GPU(s) are visible")
    return device, workers


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    logging.basicConfig(level=args.loglevel, format="[%(asctime)s %(name)s] %(message)s")
    device, workers = plan(args)
    from gpu_worker.redis_server import ensure_broker
    from tasks.settings import settings

    # A batch forms only from jobs in hand: one pool thread per job of the largest batch.
    concurrency = args.concurrency or worker_concurrency(settings.max_batch)
    children = [Child(i, worker_command(i, concurrency, args.loglevel),
                      {**worker_env(i, device), CONCURRENCY_ENV: str(concurrency)})
                for i in range(workers)]
    if device == "cuda":
        known = gpus()
        for child in children:
            child.cpus = cpus_for(child.env["CUDA_VISIBLE_DEVICES"], known)
    with ensure_broker(settings.state_dir):
        return Supervisor(children, stop_timeout_s=settings.max_job_s + 30).run()


if __name__ == "__main__":
    sys.exit(main())
