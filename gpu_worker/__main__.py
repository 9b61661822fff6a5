"""``python -m gpu_worker --workers N --device auto|cpu|cuda [--instance NAME]``: see
``launcher``."""
from __future__ import annotations

import argparse
import logging
import sys

from gpu_worker.batching import CONCURRENCY_ENV, worker_concurrency
from gpu_worker.devices import gpu_count, resolve
from gpu_worker.launcher import (
    EXIT_CONFIG,
    INSTANCE,
    Child,
    Supervisor,
    worker_command,
    worker_env,
    worker_node,
)
from gpu_worker.topology import cpus_for, gpus
from tasks.errors import ConfigError


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m gpu_worker", description=__doc__)
    parser.add_argument("--workers", type=int, default=None,
                        help="worker processes; default: one per GPU, or 1 on CPU")
    parser.add_argument("--device", choices=("auto", "cpu", "cuda"), default=None,
                        help="default: GPULANES_DEVICE (auto)")
    parser.add_argument("--concurrency", type=int, default=None,
                        help="jobs one worker holds at once (threads); default: the largest "
                             "GPULANES_MAX_BATCH, so 1 (one GPU, no batching) unless set")
    parser.add_argument("--instance", type=instance_name, default=None, metavar="NAME",
                        help="this supervisor's name among several on one host (letters, "
                             "digits, - and _): its workers are gpu0-NAME@host, gpu1-NAME@host,"
                             " ...; default: none, so gpu0@host, gpu1@host, ...")
    parser.add_argument("--loglevel", default="INFO")
    return parser.parse_args(argv)


def instance_name(value: str) -> str:
    """``--instance``, checked: it goes into worker and queue names."""
    if not INSTANCE.fullmatch(value):
        raise argparse.ArgumentTypeError(
            f"{value!r}: use 1 to 32 letters, digits, - or _, starting with a letter or digit")
    return value


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
        visible = "1 GPU is" if gpus == 1 else f"{gpus} GPUs are"
        raise SystemExit(f"--workers {workers} but only {visible} visible")
    return device, workers


def children(args: argparse.Namespace) -> list[Child]:
    """One worker per device, as ``args`` and the settings ask."""
    from tasks.settings import settings

    device, workers = plan(args)
    # A batch forms only from jobs in hand: one pool thread per job of the largest batch.
    concurrency = args.concurrency or worker_concurrency(settings.max_batch)
    started = [Child(i, worker_command(i, concurrency, args.loglevel, args.instance),
                     {**worker_env(i, device), CONCURRENCY_ENV: str(concurrency)},
                     name=worker_node(i, args.instance).split("@")[0])
               for i in range(workers)]
    if device == "cuda":
        known = gpus()
        for child in started:
            child.cpus = cpus_for(child.env["CUDA_VISIBLE_DEVICES"], known)
    return started


def main(argv: list[str] | None = None) -> int:
    """Run the supervisor until SIGTERM; a bad setting is one line on stderr and exit
    status 78 (EX_CONFIG) before anything starts."""
    args = parse_args(argv)
    logging.basicConfig(level=args.loglevel, format="[%(asctime)s %(name)s] %(message)s")
    from gpu_worker.redis_server import ensure_broker
    from tasks.settings import settings

    try:
        planned = children(args)
        stop_timeout_s = settings.max_job_s + 30
    except ConfigError as exc:
        print(f"python -m gpu_worker: {exc}", file=sys.stderr)
        return EXIT_CONFIG
    with ensure_broker(settings.state_dir):
        return Supervisor(planned, stop_timeout_s=stop_timeout_s).run()


if __name__ == "__main__":
    sys.exit(main())
