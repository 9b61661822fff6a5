"""One submitter process of the load soak: a share of the burst, as fast as it can.

Started with the ``spawn`` method by :mod:`tests.soak.load` (and by
``tests/test_load.py``), so it reads its settings afresh from the
environment it inherits. It routes from a live snapshot before the burst
begins, waits at a barrier so that every submitter starts together, then
calls ``submit()`` back to back. It keeps only the job ids of what was
accepted (a caller that held every ``AsyncResult`` would measure its own
list, not gpulanes), counts ``LaneFull`` refusals and any other error, and
samples its own resident memory at the start, the middle and the end.
"""
from __future__ import annotations

import random
import time
import traceback
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

#: Requested tiers, as shares of the burst.
TIER_MIX = {"fast": 0.2, "standard": 0.3, "relaxed": 0.5}
ACCOUNTS = tuple(f"acct{i}" for i in range(8))
#: Share of jobs that name a seed (result cache and coalescing path), drawn
#: from a small pool so that repeats happen.
SEEDED_SHARE, SEED_POOL = 0.1, 200
#: The job parameters of tests/conftest.py's SMALL: a few ms per generation.
SMALL = dict(steps=4, width=64, height=64)


@dataclass
class Share:
    """What one submitter sends: ``jobs`` jobs drawn from ``seed``."""

    index: int
    jobs: int
    seed: int


@dataclass
class Outcome:
    """What one submitter saw; plain data, so it crosses the process boundary."""

    index: int
    accepted: list[tuple[str, str]] = field(default_factory=list)  # (job id, tier)
    refused: Counter = field(default_factory=Counter)  # "tier->lane" of each LaneFull
    errors: Counter = field(default_factory=Counter)  # exception type -> count
    first_error: str = ""
    blind: int = 0  # submits made without a fresh snapshot: routed by tier (limits checked)
    submit_s: float = 0.0
    rss_kb: dict[str, int] = field(default_factory=dict)  # start, half, end, peak


def status_kb(pid: int | str, field_name: str) -> int:
    """A ``/proc/<pid>/status`` memory line in kB (``VmRSS``, ``VmHWM``); 0 when gone."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith(field_name + ":"):
                return int(line.split()[1])
    except (OSError, ValueError, IndexError):
        pass
    return 0


def plan(share: Share) -> list[dict[str, Any]]:
    """The keyword arguments of each ``submit()`` call of this share."""
    rng = random.Random(share.seed)
    tiers, weights = list(TIER_MIX), list(TIER_MIX.values())
    calls = []
    for n in range(share.jobs):
        seeded = rng.random() < SEEDED_SHARE
        calls.append(dict(tier=rng.choices(tiers, weights)[0], account=rng.choice(ACCOUNTS),
                          seed=rng.randrange(SEED_POOL) if seeded else None, **SMALL))
    return calls


def wait_for_live_view(timeout_s: float = 60.0) -> None:
    """Block until this process routes from a fresh snapshot (not by tier alone)."""
    from tasks.broker.view import snapshot_cache

    deadline = time.monotonic() + timeout_s
    while snapshot_cache().view() is None:
        if time.monotonic() > deadline:
            raise RuntimeError("no fresh lane snapshot: is beat running?")
        time.sleep(0.1)


def send_all(outcome: Outcome, calls: list[dict[str, Any]]) -> None:
    """Submit every call back to back; sort each answer into the outcome."""
    from tasks.api import submit
    from tasks.broker.view import snapshot_cache
    from tasks.errors import LaneFull

    began, cache = time.monotonic(), snapshot_cache()
    for n, call in enumerate(calls):
        if n == len(calls) // 2:
            outcome.rss_kb["half"] = status_kb("self", "VmRSS")
        outcome.blind += cache.view() is None
        try:
            result = submit(f"soak {outcome.index}-{n}", **call)
            outcome.accepted.append((result.id, call["tier"]))
        except LaneFull as exc:
            outcome.refused[f"{call['tier']}->{exc.lane}"] += 1
        except Exception as exc:  # noqa: BLE001  counted: the soak requires none
            outcome.errors[type(exc).__name__] += 1
            outcome.first_error = outcome.first_error or traceback.format_exc(limit=4)
    outcome.submit_s = time.monotonic() - began


def run_share(share: Share, barrier: Any, results: Any) -> None:
    """Process entry point: warm up, wait for the others, send, report on ``results``."""
    outcome, calls = Outcome(share.index), plan(share)
    try:
        wait_for_live_view()
        outcome.rss_kb["start"] = status_kb("self", "VmRSS")
        barrier.wait(timeout=120)
        send_all(outcome, calls)
    except Exception as exc:  # noqa: BLE001  reported, never a silent hang
        outcome.errors[type(exc).__name__] += 1
        outcome.first_error = outcome.first_error or traceback.format_exc(limit=4)
        barrier.abort()
    outcome.rss_kb.update(end=status_kb("self", "VmRSS"), peak=status_kb("self", "VmHWM"))
    results.put(outcome)
