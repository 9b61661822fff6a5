"""The page of ``benchmarks/redis_capacity.py``: how many jobs/s one Redis core
carries, and how many cores a fleet of 10,000 GPUs needs."""
from __future__ import annotations

from typing import Any

from benchmarks.pages_kit import BASELINE, Page, num, ratio, table

#: the rows per side: (label, the figure's key)
ROWS = (("Redis CPU per job (µs)", "cpu_us"),
        ("Redis command time per job (µs)", "command_us"),
        ("Redis busy over the rounds (% of a core)", "busy_pct"),
        ("jobs/s sent (worker paused)", "send_jobs_s"),
        ("jobs/s drained and read", "drain_jobs_s"),
        ("**jobs/s one core carries at {busy:.0%} busy**", "core_jobs_s"),
        ("at most (command time alone)", "core_jobs_s_most"))


def redis_capacity(data: dict[str, Any]) -> Page:
    """``benchmarks/redis_capacity.py``: Redis' cost per job at the highest rate here."""
    config, fleet, policies = data["config"], data["fleet"], data["policies"]
    best = max(policies.values(), key=lambda found: found["sides"]["gpulanes"]["core_jobs_s"])
    ours = best["sides"]["gpulanes"]
    page = Page(
        "redis_capacity", "Jobs per Redis core",
        "Each side (gpulanes serving the `echo` model, and a default Celery app; each a "
        "worker with its caller) sends jobs as fast as it can to its paused worker "
        "(SIGSTOP), then resumes it and reads every result. Redis' CPU (`INFO cpu`) and "
        "the time its commands ran (`INFO commandstats`) over both, less an as-long "
        "window with no jobs, give the cost per job at the highest rate this machine "
        "reaches; a faster fleet costs Redis less per job (more commands read per "
        "wake-up), so what one core carries is at least the first figure and at most the "
        "second. " + BASELINE,
        f"{num(ours['core_jobs_s'], 0)} to {num(ours['core_jobs_s_most'], 0)} jobs/s per "
        f"Redis core at {config['busy_share']:.0%} busy; {fleet['gpus']:,} GPUs need "
        f"{num(fleet['jobs_s'], 0)} jobs/s",
        f"Redis CPU per job {ratio(best['ratios']['cpu_us'])}")
    for policy, found in policies.items():
        sides = found["sides"]
        least, most = found["fleet_cores"]
        page.add(f"## `appendfsync {policy}`",
                 table(["per job", "gpulanes", "plain Celery"],
                       [[label.format(busy=config["busy_share"]),
                         *(num(sides[side][key], 0) for side in ("gpulanes", "plain"))]
                        for label, key in ROWS]),
                 "The commands that took longest, µs per job: gpulanes "
                 + _commands(sides["gpulanes"]) + "; plain Celery "
                 + _commands(sides["plain"]) + ".",
                 f"{fleet['gpus']:,} GPUs finish {num(fleet['jobs_s'], 0)} jobs/s: "
                 f"{num(least)} to {num(most)} Redis cores at {config['busy_share']:.0%} "
                 "busy.")
    page.add("## gpulanes' scripts",
             "Each Lua script a job runs, from a pass under a `SLOWLOG` that logs every "
             "command (which slows Redis: the times are for comparing scripts).",
             table(["script", "calls per job", "µs per call"],
                   [[f"`{name}`", num(cost["calls_per_job"], 2), num(cost["us_per_call"])]
                    for name, cost in data["scripts"].items()]))
    verdict = ("one Redis carries them" if fleet["one_redis_carries"] else
               "one Redis does not carry them: the pools of such a fleet must be spread over "
               "several Redis instances")
    return page.add("## What it means",
                    f"At {num(fleet['jobs_s'], 0)} jobs/s ({fleet['gpus']:,} GPUs), "
                    f"{verdict} (see [Scaling](../scaling.md)). Jobs of {config['jobs']} "
                    f"a round, {config['rounds']} rounds a side, the sides taking turns.")


def _commands(side: dict[str, Any]) -> str:
    return ", ".join(f"`{name.upper()}` {num(us, 0)}" for name, us in side["commands_us"].items())


RENDERERS = {"redis_capacity": redis_capacity}
