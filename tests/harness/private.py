"""A private cluster's environment: a fresh state folder, gpulanes pointed at it."""
from __future__ import annotations

import os
import shutil
import sys
import tempfile
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Callable, Iterator

ROOT = Path(__file__).resolve().parent.parent.parent


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
