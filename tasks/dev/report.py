"""Terminal output for people: a progress bar while jobs run, a per-lane table after."""
from __future__ import annotations

import statistics
import sys
import time
from collections import defaultdict
from typing import Iterable, TextIO

from celery.result import AsyncResult

from routing.names import LANES


class Progress:
    """Polls results until all are ready, redrawing one bar line as they finish."""

    def __init__(self, total: int, out: TextIO = sys.stdout, width: int = 40) -> None:
        self.total, self.out, self.width = total, out, width

    def draw(self, done: int, failed: int) -> None:
        filled = self.width * done // max(self.total, 1)
        bar = "#" * filled + "." * (self.width - filled)
        end = "\n" if done == self.total else ""
        tty = "\r" if self.out.isatty() else ""
        if tty or end or done % max(self.total // 10, 1) == 0:
            self.out.write(f"{tty}[{bar}] {done}/{self.total} done, {failed} failed{end}"
                           + ("" if tty else "\n" if not end else ""))
            self.out.flush()

    def wait(self, results: list[AsyncResult], timeout_s: float) -> list[dict]:
        """Successful result dicts, in the order of ``results``; a failed job is
        reported, not raised."""
        pending, done, failed = list(results), {}, 0
        deadline, last = time.monotonic() + timeout_s, -1
        while pending and time.monotonic() < deadline:
            for result in [r for r in pending if r.ready()]:
                pending.remove(result)
                if result.successful():
                    done[result.id] = result.result
                else:
                    failed += 1
                    print(f"\njob {result.id} failed: {result.result}", file=self.out)
            if len(done) + failed != last:
                last = len(done) + failed
                self.draw(last, failed)
            time.sleep(0.2)  # one GET per pending job per poll: keep it light
        return [done[result.id] for result in results if result.id in done]


def _percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(q * (len(ordered) - 1))))]


def lane_table(results: Iterable[dict]) -> str:
    """Jobs and latency (queue wait + run) per requested tier, and where they ran."""
    by_tier: dict[str, list[dict]] = defaultdict(list)
    for result in results:
        by_tier[result["requested_tier"]].append(result)
    head = f"{'tier':<9}{'jobs':>5}{'p50 ms':>9}{'p95 ms':>9}{'max ms':>9}  ran in lane"
    rows = [head, "-" * len(head)]
    for tier in LANES:
        batch = by_tier.get(tier, [])
        if not batch:
            continue
        latency = [r["queued_ms"] + r["run_ms"] for r in batch]
        lanes = defaultdict(int)
        for r in batch:
            lanes[r["lane"]] += 1
        where = ", ".join(f"{lane} x{n}" for lane, n in lanes.items())
        rows.append(f"{tier:<9}{len(batch):>5}{statistics.median(latency):>9.0f}"
                    f"{_percentile(latency, 0.95):>9.0f}{max(latency):>9.0f}  {where}")
    return "\n".join(rows)
