"""Pages of the job's own path: a fast job behind a backlog, the submit path, Redis
commands per job, fsync and failover."""
from __future__ import annotations

import statistics
from typing import Any

from benchmarks.pages_kit import BASELINE, Page, Plot, num, ratio, table

#: the lanes benchmark's modes, their labels and line styles
LANE_MODES = {"fifo": ("plain Celery FIFO", ":"), "plain_lanes": ("plain Celery lanes", "--"),
              "gpulanes": ("gpulanes", "-")}


def lanes(data: dict[str, Any]) -> Page:
    """``benchmarks/lanes.py``: a fast job behind a backlog of relaxed jobs."""
    config, rows = data["config"], data["summary"]
    last = rows[-1]
    page = Page(
        "lanes", "A fast job behind a relaxed backlog",
        "One gpulanes worker and one plain Celery worker, each in its own process: a "
        "blocker job holds each worker while a backlog of relaxed jobs and then one fast "
        "job are queued; the fast job's wait (submit to start, stamped by the worker) is "
        f"the median of {config['repeats']} interleaved repeats, jobs of {config['steps']} "
        f"steps at {config['size']}×{config['size']} on the CPU. " + BASELINE + " It runs "
        "the jobs in arrival order in one queue (*FIFO*) and, as *plain lanes*, each in "
        "its tier's queue, read in order (`queue_order_strategy=\"priority\"`).",
        f"fast job waits {num(last['gpulanes_wait_ms'])} ms behind {last['backlog']} "
        f"relaxed jobs (plain FIFO: {num(last['fifo_wait_ms'], 0)} ms)",
        f"FIFO / gpulanes {ratio(last['ratio'], 1)}; plain lanes / gpulanes "
        f"{ratio(last['lanes_ratio'])}")
    page.add("## Wait of the fast job", table(
        ["backlog", "plain FIFO wait ms", "plain lanes wait ms", "gpulanes wait ms",
         "FIFO / gpulanes", "plain lanes / gpulanes",
         "fast job started after (FIFO / plain lanes / gpulanes)",
         "service ms/job (plain / gpulanes)"],
        [[r["backlog"], num(r["fifo_wait_ms"]), num(r["plain_lanes_wait_ms"]),
          num(r["gpulanes_wait_ms"]), ratio(r["ratio"], 1), ratio(r["lanes_ratio"]),
          " / ".join(f"{r[f'{mode}_position']:g}" for mode in LANE_MODES) + " jobs",
          f"{num(r['plain_service_ms'])} / {num(r['gpulanes_service_ms'])}"] for r in rows]))
    return page.plot(Plot("lanes-wait.png", "fast job wait against the backlog, per mode",
                          lambda fig: _lanes_plot(fig, rows)))


def _lanes_plot(fig: Any, rows: list[dict[str, Any]]) -> None:
    ax = fig.add_subplot()
    backlogs = [r["backlog"] for r in rows]
    for mode, (label, style) in LANE_MODES.items():
        ax.plot(backlogs, [r[f"{mode}_wait_ms"] for r in rows], style, marker="o", label=label)
    ax.set_xlabel("relaxed jobs queued ahead of the fast one")
    ax.set_ylabel("fast job wait (ms, median)")
    ax.set_yscale("log")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)


SUBMIT_LABELS = {"submit": "`submit()` without a seed (validate + route + publish)",
                 "submit_seeded": "`submit(seed=i)` (claimed in the result cache)",
                 "submit_echo": "`submit(model=\"echo\")` (a class model, pydantic)",
                 "plain": "plain Celery `apply_async(queue=tier)`"}


def submit(data: dict[str, Any]) -> Page:
    """``benchmarks/submit.py``: the submit path against a plain Celery app's publish."""
    modes, paired = data["modes"], data["paired_ratio"]
    rounds = len(data["seconds"]["plain"])
    page = Page(
        "submit", "The submit path against plain Celery",
        f"Each way of publishing runs in a process of its own, in {rounds} interleaved "
        "rounds on an embedded Redis with nothing consuming; a thread stands in for beat "
        "so that `submit()` routes through `decide()` with a live snapshot. " + BASELINE +
        " The ratios are medians of the per-round ratios, so a slow stretch of the "
        "machine hits both sides of a pair.",
        f"`submit()` {num(modes['submit']['jobs_s'], 0)} jobs/s (plain Celery "
        f"{num(modes['plain']['jobs_s'], 0)})",
        f"{ratio(paired['submit'], 3)} (with a seed {ratio(paired['submit_seeded'], 3)})")
    page.add("## Publishes", table(
        ["what", "jobs/s (all rounds)", "jobs/s (median round)", "µs per call",
         "CPU µs per call"],
        [[SUBMIT_LABELS.get(mode, mode), num(m["jobs_s"], 0), num(m["median_round_jobs_s"], 0),
          num(m["us_per_call"], 0), num(m["cpu_us_per_call"], 0)] for mode, m in modes.items()]))
    page.add("Paired ratios against plain Celery (median of the rounds): " + ", ".join(
        f"{mode} {ratio(value, 3)}" for mode, value in paired.items()) + ".")
    page.add("Each round's rate, per mode: the machine's own swings are what the paired "
             "ratios cancel out.")
    page.plot(Plot("submit-rounds.png", "jobs per second of each round, per mode",
                   lambda fig: _submit_plot(fig, data["seconds"], modes)))
    return page.add("## The pure parts of `submit()`",
                    "In memory, no Redis call, µs per call:",
                    table(["part", "µs per call"],
                          [[part, num(us)] for part, us in data["pure_us"].items()]))


def _submit_plot(fig: Any, seconds: dict[str, list[list[float]]],
                 modes: dict[str, Any]) -> None:
    ax = fig.add_subplot()
    per_round = {mode: m["jobs_s"] * sum(w for w, _ in seconds[mode]) / len(seconds[mode])
                 for mode, m in modes.items()}  # jobs in one round
    for mode, rounds in seconds.items():
        ax.plot(range(1, len(rounds) + 1), [per_round[mode] / wall for wall, _ in rounds],
                ":" if mode == "plain" else "-", marker=".", label=mode)
    ax.set_xticks(range(1, len(seconds["plain"]) + 1, max(1, len(seconds["plain"]) // 10)))
    ax.set_xlabel("round")
    ax.set_ylabel("jobs/s")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)


def perjob(data: dict[str, Any]) -> Page:
    """``benchmarks/perjob.py``: Redis commands and CPU per job, end to end."""
    sides, ratios, config = data["sides"], data["ratios"], data["config"]
    ours, plain = sides["gpulanes"]["end_to_end"], sides["plain"]["end_to_end"]
    page = Page(
        "perjob", "Redis commands and CPU per job, end to end",
        "Both sides run at once on one embedded Redis (its AOF fsynced on every write, "
        "gpulanes' default), each a worker `--pool threads -c 1 -E` with late acks and "
        "prefetch 1, and a caller in a process of its own that reads every result with "
        "`.get()`. gpulanes serves the `echo` model (no weights, warm), sent by "
        "`submit(model=\"echo\", tier=\"standard\")`; the plain task returns what echo "
        "returns, sent by `apply_async`. Each side stores STARTED and SUCCESS, sends task "
        "events and reports no progress (echo's one step is its last, which gpulanes never "
        "reports). " + BASELINE,
        f"{num(ours['commands_per_job'])} Redis commands and "
        f"{num(ours['redis_cpu_us_per_job'], 0)} µs of Redis CPU per job, end to end "
        f"(plain Celery {num(plain['commands_per_job'])}, "
        f"{num(plain['redis_cpu_us_per_job'], 0)} µs)",
        f"commands {ratio(ratios['commands'])}, Redis CPU {ratio(ratios['redis_cpu'])}, "
        f"idle pickup p50 {ratio(ratios['pickup_p50'])}")
    page.add("## How it is measured", _perjob_method(config))
    page.add(f"## Per job ({config['jobs']} jobs a side end to end)",
             table(["per job", "gpulanes", "plain Celery", "gpulanes / plain", "goal"],
                   [_perjob_row(data, *row) for row in PERJOB_ROWS]),
             "Redis' CPU time goes mostly to system calls: the socket reads and writes of "
             "every round trip and, before it answers a write, the AOF's fsync (gpulanes' "
             "default); a command run inside a script adds neither. With both sides idle, "
             f"Redis used {num(data['idle_redis_cpu_pct'], 2)}% of a core.")
    return page.add("## Redis commands per job, end to end",
                    "Each command's calls per job, those inside Lua scripts included; "
                    "commands under 0.01 a job left out.",
                    table(["Redis command", "gpulanes", "plain Celery"],
                          _perjob_commands(ours, plain)))


def _perjob_method(config: dict[str, Any]) -> str:
    return (
        f"*End to end*: {config['rounds']} rounds a side, alternating the sides. Before "
        "each, `CONFIG RESETSTAT`; then the caller sends the round's jobs, `.get()`s each "
        f"and waits {config['settle_s']:g} s for late acks and events; `INFO commandstats` "
        "counts the commands Redis ran (inside Lua scripts included) and `INFO cpu` its "
        "CPU time (user + sys). After each round, as long a wait with no jobs gives the "
        "idle background (both workers, both callers, the benchmark's own reads), "
        f"subtracted. A round of {config['pass_jobs']} jobs under `MONITOR` counts the "
        "commands run inside scripts; the commands sent are the rest, a script counting "
        f"once. *Worker alone*: {config['pass_jobs']} jobs queued while the worker is "
        "paused (SIGSTOP), "
        "counted from its resume until every result is stored. *Idle pickup*: one job "
        "sent to an idle worker, from just before the send to its start as the worker "
        f"stamps it, {config['pickups']} a side, interleaved, a random pause of 0.2-1 s "
        f"before each. *Idle CPU*: both workers idle for {config['idle_s']:g} s, the CPU "
        "time of each one's processes (threads and children: for gpulanes the supervisor "
        "and its worker) as a share of one core, counted in clock ticks of 10 ms "
        f"({num(1 / config['idle_s'], 2)}% of a core over the {config['idle_s']:g} s).")


#: the per-job rows: (label, the figure's path in a side, digits, ratio key, goal key)
PERJOB_ROWS = (
    ("**Redis commands, end to end**", ("end_to_end", "commands_per_job"), 1, "commands",
     "commands"),
    ("of them inside Lua scripts", ("end_to_end", "in_scripts_per_job"), 1, None, None),
    ("commands sent (a script counts once)", ("end_to_end", "sent_per_job"), 1, "sent", None),
    ("**Redis CPU µs, end to end**", ("end_to_end", "redis_cpu_us_per_job"), 0, "redis_cpu",
     "redis_cpu"),
    ("jobs/s, end to end", ("end_to_end", "jobs_s"), 0, "jobs_s", "jobs_s"),
    ("Redis commands, worker alone", ("worker_only", "commands_per_job"), 1,
     "worker_commands", None),
    ("**idle pickup p50 ms**", ("pickup_ms", "p50"), 1, "pickup_p50", "pickup"),
    ("**idle pickup p99 ms**", ("pickup_ms", "p99"), 1, "pickup_p99", "pickup"),
    ("**idle worker CPU, % of a core**", ("idle_cpu_pct",), 2, None, "idle_cpu_pct"))

#: each goal as the page states it
PERJOB_GOALS = {"commands": "≤ {:g}x", "redis_cpu": "≤ {:g}x", "jobs_s": "≥ {:g}x",
                "pickup": "≤ {:g}x", "idle_cpu_pct": "≤ {:g}% (each side)"}


def _perjob_row(data: dict[str, Any], label: str, path: tuple[str, ...], digits: int,
                ratio_key: str | None, goal_key: str | None) -> list[str]:
    cells = []
    for side in ("gpulanes", "plain"):
        value = data["sides"][side]
        for key in path:
            value = value[key]
        cells.append(num(value, digits))
    goal = "–"
    if goal_key:
        goal = (PERJOB_GOALS[goal_key].format(data["goals"][goal_key])
                + (": met" if data["met"][goal_key] else ": **not met**"))
    return [label, *cells, ratio(data["ratios"][ratio_key]) if ratio_key else "–", goal]


def _perjob_commands(ours: dict[str, Any], plain: dict[str, Any]) -> list[list[str]]:
    """A row per Redis command (most per gpulanes job first)."""
    names = sorted({name for side in (ours, plain) for name, calls in side["per_job"].items()
                    if calls >= 0.005},
                   key=lambda name: (-ours["per_job"].get(name, 0), name))
    return [[f"`{name.upper()}`", num(ours["per_job"].get(name, 0), 2),
             num(plain["per_job"].get(name, 0), 2)] for name in names]


def durability(data: dict[str, Any]) -> Page:
    """``benchmarks/durability.py``: what fsyncing each accepted job costs a submit."""
    policies, over = data["policies"], data["throughput_over_everysec"]
    lost = sum(row["lost_after_kill"] for row in policies.values())
    page = Page(
        "durability", "What fsyncing each job costs a submit",
        f"{data['threads']} threads submit {data['jobs']} jobs a round, {data['rounds']} "
        "interleaved rounds, to an embedded Redis with no workers, under each "
        "`appendfsync` policy (and with a replica that confirms each write); then Redis "
        "is SIGKILLed, restarted from its AOF, and the accepted jobs that are not there "
        "are counted. The baseline is Redis' `everysec`.",
        f"{lost} accepted jobs lost to a SIGKILL of Redis",
        "; ".join(f"{kind}: {ratio(value)} of everysec's submits/s"
                  for kind, value in over.items()))
    return page.add("## Submits", table(
        ["appendfsync", "submits/s", "p50 ms", "p99 ms", "accepted jobs lost to a SIGKILL"],
        [[kind, num(r["jobs_per_s"], 0), num(r["p50_ms"], 2), num(r["p99_ms"], 2),
          r["lost_after_kill"]] for kind, r in policies.items()]))


def failover(data: dict[str, Any]) -> Page:
    """``benchmarks/failover.py``: Redis failover under load, every job counted."""
    runs = data["runs"]
    lost = sum(r["counts"]["lost"] for r in runs)
    twice = sum(r["ran_twice"] for r in runs)
    page = Page(
        "failover", "Redis failover under load",
        "A primary, replicas and three Sentinels; CPU workers, beats and an exporter run "
        "while a stream of jobs is submitted, and the primary is killed, frozen or left "
        "behind by its replicas. Every job is counted: accepted, refused (the caller is "
        "told), done, lost, run twice; seconds count from the fault.",
        f"{lost} accepted jobs lost, {twice} run twice, in {len(runs)} faults",
        "–")
    return page.add("## Faults", table(
        ["scenario", "submitted", "accepted", "refused", "done", "lost", "run twice",
         "new primary named", "submits back"],
        [[r["label"], r["counts"]["submitted"], r["counts"]["accepted"],
          r["counts"]["refused"], r["counts"]["completed"], r["counts"]["lost"],
          r["ran_twice"], _seconds(r["timeline"].get("promoted_s")),
          _seconds(r["timeline"].get("submits_back_s"))] for r in runs]))


def _seconds(value: float | None) -> str:
    return "–" if value is None else f"{value:.1f} s"


RENDERERS = {"lanes": lanes, "submit": submit, "perjob": perjob,
             "durability": durability, "failover": failover}
