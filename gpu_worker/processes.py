"""Child processes that stop with their parent and ignore the terminal's Ctrl-C.

Every process gpulanes starts (workers, the embedded Redis, beat) gets its own
session, so a Ctrl-C reaches only the process that owns it and shutdown runs
in order: workers finish their jobs first, Redis stops last. On Linux each
also gets SIGTERM if its parent dies, so nothing is left running.
"""
from __future__ import annotations

import ctypes
import os
import signal
import subprocess
from typing import Any, Iterable

PR_SET_PDEATHSIG = 1


def _die_with_parent() -> None:
    try:
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGTERM)
    except OSError:  # not Linux: the parent's own shutdown has to do
        pass


def spawn(args: list[str], cpus: Iterable[int] | None = None,
          **kwargs: Any) -> subprocess.Popen:
    """``Popen`` in a new session, sent SIGTERM when this process dies, and
    bound to ``cpus`` when given."""
    cpus = set(cpus or ())

    def prepare() -> None:
        _die_with_parent()
        if cpus:
            os.sched_setaffinity(0, cpus)

    return subprocess.Popen(args, start_new_session=True, preexec_fn=prepare, **kwargs)
