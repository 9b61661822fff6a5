"""The load soak's figures as table rows, each with its bound and a verdict.

Memory per process: a submitter's columns are its resident memory before its
first submit, at its middle submit and after its last, and its high-water
mark; a cluster process' columns are its resident memory when the burst
began, its highest over the first and over the second half of the run
(burst + drain), and its high-water mark. Memory that grows with the number
of jobs handled shows as the later column above the earlier one.
"""
from __future__ import annotations

from collections import Counter
from typing import Any, Iterable

from routing.names import LANES
from routing.policy import RETRY, WAITED_PAST_BUDGET
from tests.harness.tables import percentile

MB = 1024 * 1024
#: Growth a process may show between the halves (allocator noise, caches warming).
GROWTH_LIMIT_MB = 25.0
#: Redis memory that is not jobs: client buffers, the AOF buffer, fragmentation.
REDIS_SLACK_MB = 32.0


def _by_tier(counts: Counter) -> str:
    return " / ".join(f"{tier} {counts.get(tier, 0)}" for tier in ("fast", "standard", "relaxed"))


def _row(figure: str, measured: Any, bound: str = "", ok: bool | None = None) -> tuple:
    return figure, measured, bound, "" if ok is None else ("yes" if ok else "NO")


def submit_rows(f: dict[str, Any]) -> list[tuple]:
    """Accepted, refused and failed submits."""
    outcomes = f["burst"].outcomes
    accepted = Counter(tier for o in outcomes for _, tier in o.accepted)
    refused = Counter(key.split("->")[0] for o in outcomes for key in o.refused.elements())
    lanes = Counter(key.split("->")[1] for o in outcomes for key in o.refused.elements())
    errors = sum((o.errors for o in outcomes), Counter())
    submitted = sum(accepted.values()) + sum(refused.values()) + sum(errors.values())
    burst_s = f["burst"].ended - f["burst"].began
    return [
        _row("submits", f"{submitted} from {f['procs']} processes in {burst_s:.1f} s "
             f"({submitted / burst_s:.0f}/s)", f"{f['jobs']}", submitted == f["jobs"]),
        _row("accepted", f"{sum(accepted.values())} ({_by_tier(accepted)})"),
        _row("refused with LaneFull", f"{sum(refused.values())} ({_by_tier(refused)}); "
             f"lane named: {dict(lanes) or '-'}"),
        _row("other errors", f"{sum(errors.values())} {dict(errors) or ''}".strip(), "0",
             not errors),
    ]


def moved_into(results: Iterable[dict]) -> Counter:
    """Jobs put into each lane after they were accepted: moved down by beat or
    retried a lane down, counted in every lane below their tier down to the one
    they ran in. Only these may take a lane past its limit: a submit's publish
    checks the limit in Redis, and a job once accepted is never refused."""
    counts: Counter = Counter()
    for r in results:
        if r.get("downgrade_reason") in (WAITED_PAST_BUDGET, RETRY):
            counts.update(LANES[LANES.index(r["requested_tier"]) + 1:
                                LANES.index(r["lane"]) + 1])
    return counts


def lane_rows(f: dict[str, Any]) -> list[tuple]:
    """How deep each lane got against its limit, and which jobs ran below their tier."""
    samples, limits = f["probe"].samples, f["max_depth"]
    peak = {lane: max(s.depths[lane] for s in samples) for lane in limits}
    moved = Counter(r["downgrade_reason"] for r in f["fate"].results.values()
                    if r.get("downgrade_reason"))
    refused = sum(sum(o.refused.values()) for o in f["burst"].outcomes)
    blind = sum(o.blind for o in f["burst"].outcomes)
    moved_in = moved_into(f["fate"].results.values())
    full = peak["relaxed"] >= 0.9 * limits["relaxed"]
    return [
        _row("deepest lane (fast / standard / relaxed)",
             " / ".join(str(peak[lane]) for lane in limits),
             "≤ " + " / ".join(f"{limits[lane]} + {moved_in[lane]}" for lane in limits)
             + " moved down or retried",
             all(peak[lane] <= limits[lane] + moved_in[lane] for lane in limits)),
        _row("submits routed without a fresh snapshot (by tier; limits still checked)",
             blind),
        _row("LaneFull only once relaxed was full",
             f"relaxed peaked at {peak['relaxed'] / limits['relaxed']:.0%} of its limit",
             "refusals only at ≥ 90 %", full or not refused),
        _row("ran below their tier, by reason", ", ".join(
            f"{reason} {n}" for reason, n in sorted(moved.items())) or "none"),
    ]


def fate_rows(f: dict[str, Any]) -> list[tuple]:
    """What became of the accepted jobs."""
    fate, burst = f["fate"], f["burst"]
    accepted = sum(len(o.accepted) for o in burst.outcomes)
    cached = sum(1 for r in fate.results.values() if r.get("cached"))
    return [
        _row("completed", f"{len(fate.results)} of {accepted} ({cached} from the cache "
             f"or a shared run); drained {fate.waited_s:.0f} s after the burst",
             f"{accepted}", len(fate.results) == accepted),
        _row("failed / lost", f"{len(fate.failed)} / {len(fate.missing)}", "0 / 0",
             not fate.failed and not fate.missing),
    ]


def _waits_s(results: Iterable[dict]) -> list[float]:
    return [r["queued_ms"] / 1000 for r in results if not r.get("cached")]


def fast_rows(f: dict[str, Any]) -> list[tuple]:
    """Queue wait of fast jobs against the fast lane's budget."""
    budget_s, results = f["budget_s"], f["fate"].results.values()
    fast = [r for r in results if r["requested_tier"] == "fast"]
    in_lane = _waits_s(r for r in fast if r["lane"] == "fast")
    within = sum(w <= budget_s for w in _waits_s(fast))
    stats = " / ".join(f"{percentile(in_lane, q) or 0:.2f}" for q in (0.5, 0.95, 1.0))
    return [
        _row("fast jobs run in the fast lane: wait p50 / p95 / max s",
             f"{stats} (n={len(in_lane)})", f"≤ {budget_s:g} (fast budget)",
             bool(in_lane) and max(in_lane) <= budget_s),
        _row("all fast-tier jobs within that budget",
             f"{within} of {len(_waits_s(fast))}"),
    ]


def redis_rows(f: dict[str, Any]) -> list[tuple]:
    """Redis memory against what the lane limits and the stored results allow."""
    probe, limits = f["probe"], f["max_depth"]
    message_b = sum(probe.message_bytes) / max(1, len(probe.message_bytes))
    accepted = sum(len(o.accepted) for o in f["burst"].outcomes)
    peak = max(s.used_memory for s in probe.samples)
    bound = (f["redis_before"] + 2 * message_b * sum(limits.values())
             + 1.5 * f["stored_bytes"] * accepted + REDIS_SLACK_MB * MB)
    return [
        _row("Redis used_memory before / peak / end MB",
             f"{f['redis_before'] / MB:.1f} / {peak / MB:.1f} / "
             f"{probe.samples[-1].used_memory / MB:.1f}",
             f"peak ≤ {bound / MB:.0f}", peak <= bound),
        _row("bytes per queued message / per finished job kept",
             f"{message_b:.0f} / {f['stored_bytes']:.0f}",
             "bound: 2 x message x Σ limits + 1.5 x kept x accepted + 32 MB"),
    ]


def _cluster_memory(f: dict[str, Any]) -> dict[str, tuple[float, ...]]:
    probe, began, ended = f["probe"], f["burst"].began, f["drained_at"]
    middle = (began + ended) / 2
    first, second = probe.window(began, middle), probe.window(middle, ended)
    start = first[0] if first else probe.samples[0]
    return {name: (start.rss_kb[name] / 1024,
                   max((s.rss_kb[name] for s in first), default=0) / 1024,
                   max((s.rss_kb[name] for s in second), default=0) / 1024,
                   f["hwm_kb"].get(name, 0) / 1024) for name in probe.pids}


def _submitter_memory(f: dict[str, Any]) -> dict[str, tuple[float, ...]]:
    return {f"submitter {o.index}": tuple(o.rss_kb.get(k, 0) / 1024
                                          for k in ("start", "half", "end", "peak"))
            for o in f["burst"].outcomes}


def memory_rows(f: dict[str, Any]) -> list[tuple]:
    table = {**_submitter_memory(f), **_cluster_memory(f)}
    return [(name, *(f"{mb:.1f}" for mb in figures)) for name, figures in table.items()]


def growth_rows(f: dict[str, Any]) -> list[tuple]:
    table = {**_submitter_memory(f), **_cluster_memory(f)}
    growth = {name: figures[2] - figures[1] for name, figures in table.items()}
    worst = max(growth, key=growth.get)
    return [_row("process memory, 2nd half over 1st (largest)",
                 f"{growth[worst]:+.1f} MB ({worst})", f"≤ {GROWTH_LIMIT_MB:g} MB",
                 growth[worst] <= GROWTH_LIMIT_MB)]


def report_rows(f: dict[str, Any]) -> list[tuple]:
    """Every row of the soak's main table."""
    return [*submit_rows(f), *lane_rows(f), *fate_rows(f), *fast_rows(f), *redis_rows(f),
            *growth_rows(f)]
