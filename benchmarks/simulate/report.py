"""The simulator's tables, and the figures the policy work is judged by.

Per scenario and mode: waits per lane, share of each tier within its budget, mode
changes per minute, cold loads, relaxed waits of heavy against light accounts; then,
gpulanes against plain lanes on the same jobs: served jobs/s, standard and fast
within budget, gpulanes' worst wait against plain lanes' p99.
"""
from __future__ import annotations

from typing import Any, Mapping

from routing.names import LANES

from benchmarks.common import markdown_table


def _s(value: float | None) -> str:
    return "-" if value is None else f"{value:.1f}"


def _pct(value: float | None) -> str:
    return "-" if value is None else f"{100 * value:.1f}%"


def lanes_table(results: Mapping[str, Mapping[str, Any]]) -> str:
    """One row per (scenario, mode): p50/p95/p99 wait (s) of each lane."""
    headers = ["scenario", "mode", *(f"{lane} p50/p95/p99" for lane in LANES)]
    rows = []
    for name, result in results.items():
        for mode, figs in result["modes"].items():
            rows.append([name, mode, *("/".join(_s(figs["lanes"][lane][q])
                                                 for q in ("p50", "p95", "p99"))
                                        for lane in LANES)])
    return markdown_table(headers, rows, "ll" + "r" * len(LANES))


def policy_table(results: Mapping[str, Mapping[str, Any]]) -> str:
    """One row per (scenario, mode): budgets met, mode changes, cold loads, fairness."""
    headers = ["scenario", "mode", "offered", "refused", "served jobs/s",
               *(f"{tier} in budget" for tier in LANES), "fast in budget, in allowance",
               "mode changes/min", "cold loads",
               "relaxed heavy p50/p95", "relaxed light p50/p95"]
    rows = []
    for name, result in results.items():
        for mode, f in result["modes"].items():
            heavy, light = f["relaxed_accounts"]["heavy"], f["relaxed_accounts"]["light"]
            rows.append([name, mode, f["offered"], f["refused"], f["served_jobs_s"],
                         *(_pct(f["within_budget"][tier]) for tier in LANES),
                         _pct(f.get("fast_allowed_within_budget")),
                         f["mode_changes_per_min"], f["cold_loads"],
                         f"{_s(heavy['p50'])}/{_s(heavy['p95'])}",
                         f"{_s(light['p50'])}/{_s(light['p95'])}"])
    return markdown_table(headers, rows, "ll" + "r" * (len(headers) - 2))


def versus(modes: Mapping[str, Mapping[str, Any]]) -> dict[str, Any]:
    """gpulanes against plain lanes on the same jobs (None where a mode is missing)."""
    ours, plain = modes.get("gpulanes"), modes.get("plain")
    if ours is None or plain is None:
        return {}
    return {"served_jobs_s": [ours["served_jobs_s"], plain["served_jobs_s"]],
            "standard_within_budget": [ours["within_budget"]["standard"],
                                       plain["within_budget"]["standard"]],
            "fast_within_budget": [ours["within_budget"]["fast"],
                                   plain["within_budget"]["fast"]],
            "worst_wait_s": ours["worst_wait_s"], "plain_p99_wait_s": plain["all"]["p99"],
            "worst_over_plain_p99": round(ours["worst_wait_s"] / plain["all"]["p99"], 3)
            if plain["all"]["p99"] else None}


def versus_table(results: Mapping[str, Mapping[str, Any]]) -> str:
    """Per scenario: gpulanes / plain for each figure the policy work must move."""
    headers = ["scenario", "served jobs/s", "standard in budget", "fast in budget",
               "gpulanes worst wait s", "plain p99 wait s"]
    rows = []
    for name, result in results.items():
        v = result.get("versus")
        if not v:
            continue
        rows.append([name, f"{v['served_jobs_s'][0]} / {v['served_jobs_s'][1]}",
                     " / ".join(_pct(x) for x in v["standard_within_budget"]),
                     " / ".join(_pct(x) for x in v["fast_within_budget"]),
                     _s(v["worst_wait_s"]), _s(v["plain_p99_wait_s"])])
    return markdown_table(headers, rows)


def print_report(report: Mapping[str, Any]) -> None:
    """Every table, with the run's size and settings on top."""
    print(f"{report['gpus']} GPUs, {report['minutes']:g} simulated minutes per scenario, "
          f"seed {report['seed']}; budgets {report['budgets_s']} s (relaxed "
          f"{report['relaxed_budget_s']:g} s); capacity {report['capacity_jobs_s']} jobs/s "
          "(every model warm)\n")
    results = report["scenarios"]
    print("Waits (s) per lane a job ran in:\n")
    print(lanes_table(results))
    print("\nBudgets, policy and accounts (within budget: per requested tier):\n")
    print(policy_table(results))
    print("\ngpulanes / plain lanes, the same jobs:\n")
    print(versus_table(results))
    print(f"\nsimulator CPU: {report['cpu_s']} s in all")
