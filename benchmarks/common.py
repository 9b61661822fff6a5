"""What the benchmarks share: a private embedded Redis, plain Celery kwargs, tables
(the private cluster's environment and the tables from ``tests.harness``, which the
soak suites share).

Nothing here imports the project at module level: ``tasks`` reads its
settings once, at import, so :func:`private_env` must run first.
"""
from __future__ import annotations

import argparse
import json
import socket
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterable

from tests.harness.private import ROOT, private_env, run_private, state_dir  # noqa: F401
from tests.harness.tables import markdown_table, percentile, table_row  # noqa: F401

TIERS = ("fast", "standard", "relaxed")
#: where each benchmark writes its figures by default
RESULTS = ROOT / "docs" / "results"
PROMPT = "a lighthouse in a storm"


@dataclass(frozen=True)
class JobSize:
    """Denoising steps and image side (pixels) of every job of a run."""

    steps: int
    size: int


def free_port() -> int:
    """A TCP port nobody listens on now."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def json_option(parser: argparse.ArgumentParser, name: str) -> None:
    """Add ``--json PATH`` to a benchmark's ``parser``: where its figures go
    (default ``docs/results/<name>.json``, which the docs' pages are made from)."""
    parser.add_argument("--json", type=Path, metavar="PATH", default=RESULTS / f"{name}.json",
                        help=f"write the figures here (default: docs/results/{name}.json; "
                             "'-': nowhere)")


def write_json(path: Path | None, report: dict[str, Any] | list[Any]) -> None:
    """Write ``report`` to ``path`` as indented JSON, a ``meta`` block first (commit,
    date, machine, versions, command line); nothing when ``path`` is None or ``-``.
    A list is written under ``runs``."""
    if not path or str(path) == "-":
        return
    from benchmarks.stamp import stamp

    body = report if isinstance(report, dict) else {"runs": report}
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"meta": stamp(), **body}, indent=2, default=str) + "\n")


def finish(figures: dict[str, Any] | None, report: Callable[[dict[str, Any]], None],
           path: Path | None) -> int:
    """A benchmark's exit status: ``figures`` printed by ``report`` and written to
    ``path`` by :func:`write_json`, 0; 130 when :func:`run_private` was interrupted (None)."""
    if figures is None:
        return 130
    report(figures)
    write_json(path, figures)
    return 0


# --- jobs ----------------------------------------------------------------------------
def plain_kwargs(prompt: str, tier: str, account: str, seed: int, size: JobSize,
                 model: str = "demo") -> dict[str, Any]:
    """The job task's kwargs a plain Celery user sends, in the shape ``submit`` builds.

    No validation and no routing: the job runs in the lane named like its
    tier, standard work is marked downgradable (``submit``'s default), and
    ``submitted_at`` is now.
    """
    job = {"prompt": prompt, "tier": tier, "account": account, "model": model, "seed": seed,
           "steps": size.steps, "width": size.size, "height": size.size,
           "downgradable": tier == "standard"}
    return {"job": job, "route": {"lane": tier, "requested_tier": tier},
            "submitted_at": time.time()}


def check_size(script: str, size: JobSize, account: str) -> None:
    """Exit naming ``script`` when ``size`` is not a valid job size (before any process starts)."""
    from tasks.errors import InvalidJob
    from tasks.jobs.schema import validate

    try:
        validate(PROMPT, tier="fast", account=account, model="demo", seed=0,
                 steps=size.steps, width=size.size, height=size.size)
    except InvalidJob as exc:
        raise SystemExit(f"benchmarks/{script}: bad --steps/--size: {exc}") from exc


def stop_processes(conns: Iterable[Any], processes: Iterable[Any]) -> None:
    """Tell each benchmark process to stop (``None`` down its pipe), and wait for it
    (10 s, then it is killed)."""
    for conn in conns:
        try:
            conn.send(None)
        except OSError:
            pass
    for process in processes:
        process.join(10)
        if process.is_alive():
            process.kill()
