"""What the benchmarks share: a private embedded Redis, plain Celery kwargs, tables.

Nothing here imports the project at module level: ``tasks`` reads its
settings once, at import, so :func:`private_env` must run first.
"""
from __future__ import annotations

import json
import os
import shutil
import socket
import sys
import tempfile
import time
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator, Sequence

ROOT = Path(__file__).resolve().parent.parent
TIERS = ("fast", "standard", "relaxed")
PROMPT = "a lighthouse in a storm"


@dataclass(frozen=True)
class JobSize:
    """Denoising steps and image side (pixels) of every job of a run."""

    steps: int
    size: int


# --- a private cluster -------------------------------------------------------------
def free_port() -> int:
    """A TCP port nobody listens on now."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@contextmanager
def state_dir(prefix: str) -> Iterator[Path]:
    """A fresh folder under /tmp (short: it holds the Redis socket), removed on exit
    unless ``GPULANES_KEEP_STATE`` is set (to read the logs afterwards)."""
    path = Path(tempfile.mkdtemp(prefix=prefix, dir="/tmp"))
    try:
        yield path
    finally:
        if not os.environ.get("GPULANES_KEEP_STATE"):
            shutil.rmtree(path, ignore_errors=True)


def private_env(state: Path, **extra: Any) -> None:
    """Point gpulanes at a private Redis in ``state``, on the CPU; run before importing tasks.

    ``extra`` adds settings by name without the ``GPULANES_`` prefix, e.g.
    ``HEARTBEAT_S=1``. Child processes find the project through ``PYTHONPATH``.
    The result cache is off unless ``CACHE="on"`` is given: the benchmarks that
    set gpulanes against plain Celery send the same seeded jobs in every repeat,
    and answering those from the cache would measure the cache, not the lanes.
    """
    os.environ.update({
        "GPULANES_BROKER_URL": f"redis+socket://{state}/redis.sock",
        "GPULANES_STATE_DIR": str(state),
        "GPULANES_ARTIFACT_DIR": str(state / "artifacts"),
        "GPULANES_MODEL_DIR": str(state / "models"),
        "GPULANES_DEVICE": "cpu",
        "GPULANES_CACHE": "off",
        "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])),
        **{f"GPULANES_{name}": str(value) for name, value in extra.items()},
    })


def run_private(prefix: str, bench: Callable[[Path], dict[str, Any]], stopped: str,
                **extra: Any) -> dict[str, Any] | None:
    """``bench(state)`` in a fresh state folder with :func:`private_env` set.

    Returns its report with ``wall_s`` added, or None after Ctrl-C (it then
    prints ``interrupted; <stopped>``); the folder is removed either way.
    """
    began = time.monotonic()
    try:
        with state_dir(prefix) as state:
            private_env(state, **extra)
            report = bench(state)
    except KeyboardInterrupt:
        print(f"interrupted; {stopped}", file=sys.stderr)
        return None
    report["wall_s"] = round(time.monotonic() - began, 1)
    return report


def write_json(path: Path | None, report: dict[str, Any]) -> None:
    """Write ``report`` to ``path`` (when given) as indented JSON."""
    if path:
        path.write_text(json.dumps(report, indent=2, default=str) + "\n")


def finish(figures: dict[str, Any] | None, report: Callable[[dict[str, Any]], None],
           path: Path | None) -> int:
    """A benchmark's exit status: ``figures`` printed by ``report`` and written to
    ``path`` (when given), 0; 130 when :func:`run_private` was interrupted (None)."""
    if figures is None:
        return 130
    report(figures)
    write_json(path, figures)
    return 0


# --- jobs ----------------------------------------------------------------------------
def plain_kwargs(prompt: str, tier: str, account: str, seed: int, size: JobSize,
                 model: str = "demo") -> dict[str, Any]:
    """The ``generate`` kwargs a plain Celery user sends, in the shape ``submit`` builds.

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


# --- figures and tables ----------------------------------------------------------------
def percentile(values: Sequence[float], q: float) -> float | None:
    """The nearest-rank ``q`` quantile (0..1) of ``values``; None when there are none."""
    if not values:
        return None
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(q * (len(ordered) - 1))))]


def markdown_table(headers: Sequence[str], rows: Iterable[Sequence[Any]],
                   align: str = "") -> str:
    """A markdown table; ``align`` holds ``l`` or ``r`` per column (default: the
    first column left, the others right). An empty cell prints as ``| |``."""
    align = align or "l" + "r" * (len(headers) - 1)
    rule = "|" + "|".join("---:" if a == "r" else "---" for a in align) + "|"
    return "\n".join([table_row(headers), rule, *(table_row(row) for row in rows)])


def table_row(cells: Sequence[Any]) -> str:
    """``["a", "", 3]`` -> ``"| a | | 3 |"``."""
    return "|" + "|".join(f" {cell} " if str(cell) else " " for cell in cells) + "|"
