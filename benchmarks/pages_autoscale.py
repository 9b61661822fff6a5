"""The autoscaling pages: live (``python benchmarks/autoscale.py``: a real cluster that
follows its scaling signal through a load step) and simulated (``python -m
benchmarks.simulate --autoscale``: gpulanes' scaling signal, the best queue-length
scaler and a clairvoyant on one day of jobs)."""
from __future__ import annotations

from typing import Any, Callable

from benchmarks.pages_kit import Page, Plot, num, pct, ratio, table

LANES = ("fast", "standard", "relaxed")
#: a colour per scaler
COLORS = {"gpulanes": "tab:blue", "queue-length": "tab:orange", "clairvoyant": "tab:gray"}


def autoscale(data: dict[str, Any]) -> Page:
    runs, keda = data["runs"], data["runs"]["queue-length"]
    ours, theirs = data["gpu_hours_vs_clairvoyant"], data["queue_length_vs_clairvoyant"]
    page = Page(
        "autoscale_sim", "Autoscaling, simulated",
        f"One pool of up to {data['gpus']:,} simulated GPUs serves a day of jobs "
        f"({data['jobs']:,} in {data['hours']:g} h: a night trough, an evening peak and a "
        "flash crowd), the same jobs for every scaler, with the same fleet limits. A new "
        f"worker serves {num(data['warm_s'], 0)} s after it starts ({num(data['boot_s'], 0)} s "
        f"boot, {num(data['load_s'], 0)} s loading its models) and is paid from its start. "
        "A stopped worker hands its running job on at its next step. Scalers: gpulanes' "
        "scaling signal (the real `routing.scaling` functions, every 1 s heartbeat); a "
        "queue-length scaler as KEDA and the HPA run it (every 15 s, queued plus running "
        "jobs over a target per worker, 10 % tolerance), its target and cooldown chosen by "
        "a grid search for its best result; and a clairvoyant that runs the signal's "
        "queueing model with every lane held to a budget (relaxed to ten minutes, no "
        "backlog planned) on the trace's real arrivals per minute, and starts each worker "
        "exactly one warm-up ahead.",
        f"GPU-hours {ratio(ours, 3)} of the clairvoyant's, fast "
        f"{pct(runs['gpulanes']['fast']['within'], 2)} within budget",
        f"GPU-hours {ratio(ours, 3)} vs {ratio(theirs, 3)} (queue-length) of the "
        "clairvoyant's")
    page.add("## Scalers on the same day", table(
        ["scaler", *(f"{lane} within {num(data['budgets_s'].get(lane, 600), 0)} s"
                     for lane in LANES), "fast p99.9 s", "standard p99 s", "GPU-hours",
         "vs clairvoyant", "workers started", "jobs handed on"],
        [[name, *(pct(run[lane]["within"], 2) for lane in LANES), num(run["fast"]["p999_s"]),
          num(run["standard"]["p99_s"]), num(run["gpu_hours"]),
          ratio(run["gpu_hours"] / runs["clairvoyant"]["gpu_hours"], 3),
          f"{run['starts']:,}", f"{run['handed_over']:,}"] for name, run in runs.items()],
        "l" + "r" * 9),
        f"The queue-length scaler's best: target {keda['target']:g} jobs per worker, "
        f"cooldown {keda['cooldown_s']:g} s.")
    page.add("## Goals", table(
        ["goal", "met"], [[_goal(name, data), "yes" if met else "**no**"]
                          for name, met in data["met"].items()], "lr"))
    page.add("## The queue-length scaler's grid", table(
        ["target", "cooldown s", "fast within", "standard within", "GPU-hours"],
        [[f"{g['target']:g}", f"{g['cooldown_s']:g}", pct(g["fast"]["within"], 2),
          pct(g["standard"]["within"], 2), num(g["gpu_hours"])] for g in data["grid"]],
        "rrrrr"))
    page.plot(Plot("autoscale-fleet.png", "workers wanted and current (serving) over the day",
                   _fleet_plot(data["series"]), (8.0, 3.6)))
    page.plot(Plot("autoscale-waits.png", "p99 wait per lane over the day",
                   _waits_plot(data["series"], data["budgets_s"]), (8.0, 3.6)))
    return page


def _goal(name: str, data: dict[str, Any]) -> str:
    goals = data["goals"]
    return {"fast": f"fast: {pct(goals['fast'], 1)} within budget",
            "standard": f"standard: {pct(goals['standard'], 0)} within budget",
            "gpu_hours_vs_clairvoyant":
                f"GPU-hours at most {goals['gpu_hours_vs_clairvoyant']:g}x the clairvoyant's",
            "ahead_of_queue_length":
                "ahead of the queue-length scaler on both budgets and GPU-hours"}[name]


def _fleet_plot(series: dict[str, Any]) -> Callable[[Any], None]:
    def draw(fig: Any) -> None:
        ax = fig.add_subplot()
        for name, found in series.items():
            points = found["fleet"]
            hours = [p[0] / 3600 for p in points]
            if name == "gpulanes":
                ax.plot(hours, [p[1] for p in points], color=COLORS[name], linewidth=0.9,
                        label=f"{name}: wanted")
            ax.plot(hours, [p[2] for p in points], ":" if name == "gpulanes" else "-",
                    color=COLORS.get(name), linewidth=0.9, label=f"{name}: current")
        ax.set_xlabel("hour of the day")
        ax.set_ylabel("workers")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    return draw


def _waits_plot(series: dict[str, Any], budgets_s: dict[str, float]) -> Callable[[Any], None]:
    lanes = {"fast": "tab:red", "standard": "tab:blue", "relaxed": "tab:green"}
    styles = {"gpulanes": "-", "queue-length": "--", "clairvoyant": ":"}

    def draw(fig: Any) -> None:
        ax = fig.add_subplot()
        for name, found in series.items():
            for lane, points in found["waits"].items():
                ax.plot([p[0] / 3600 for p in points], [p[1] for p in points],
                        styles.get(name, "-"), color=lanes[lane], linewidth=0.9,
                        label=f"{lane} ({name})")
        for lane, budget_s in budgets_s.items():
            ax.axhline(budget_s, color=lanes.get(lane, "k"), alpha=0.3, linewidth=0.6)
        ax.set_xlabel("hour of the day, by arrival")
        ax.set_ylabel("p99 wait (s)")
        ax.set_yscale("symlog", linthresh=0.1)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=6, ncol=3)
    return draw


def live(data: dict[str, Any]) -> Page:
    up, down, jobs = data["step_up"], data["step_down"], data["jobs"]
    page = Page(
        "autoscale", "Autoscaling, live",
        f"A real cluster (an embedded Redis, beat, the exporter) and a loop that does what "
        f"KEDA and the HPA do: every {num(data['poll_s'], 0)} s it reads the pool's `wanted` "
        "from `/scaling` and starts or stops single-worker supervisors to match, between "
        f"{data['least']} and {data['most']}; a scale-down is a SIGTERM, and the stopped "
        "worker hands its running job on. Standard jobs of a model whose steps take a set "
        f"time, as a GPU's do ({data['job']['steps']} steps of {data['job']['step_ms']} ms), "
        f"arrive as a Poisson stream: {data['rates']['low']:g} per second, a step up to "
        f"{data['rates']['high']:g} for {num(data['phase_s']['high'], 0)} s, then back. Beat "
        "runs as shipped: a 60 s boot estimate, 300 s of lower need before a scale-down.",
        f"enough workers {num(up['enough_s'], 0)} s after the step up; "
        f"{jobs['lost']} of {jobs['accepted']:,} jobs lost",
        f"{ratio(data['worker_s_vs_fixed'])} the worker-seconds of a fixed fleet of "
        f"{data['most']}")
    page.add("## The step up", table(
        ["wanted before", "wanted at most", "enough workers", "signal asked after s",
         "enough workers serving after s"],
        [[up["wanted_before"], up["peak_wanted"], up["enough"], num(up["asked_s"]),
          num(up["enough_s"])]], "rrrrr"))
    page.add("## The step down", table(
        ["scale-downs after s", "back to the fewest after s", "stopped workers' exits"],
        [[", ".join(num(d["after_s"], 0) for d in down["scale_downs"]) or "none",
          num(down["back_to_least_s"], 0),
          f"codes {data['supervisors']['exit_codes']}, "
          f"{', '.join(num(s) for s in data['supervisors']['exit_s'])} s after SIGTERM"]],
        "rrl"))
    page.add("## Waits", table(
        ["jobs submitted", "jobs", "p50 s", "p95 s", "max s", "within 60 s"],
        [[phase, w["jobs"], num(w.get("p50_s")), num(w.get("p95_s")), num(w.get("max_s")),
          pct(w.get("within"), 1)] for phase, w in data["waits"].items()], "lrrrrr"))
    page.add("## Every job", table(
        ["accepted", "refused", "completed", "failed", "lost", "ran twice to its end",
         "handed on at a scale-down", "worker-seconds", "vs a fixed fleet"],
        [[jobs["accepted"], jobs["refused"], jobs["completed"], jobs["failed"], jobs["lost"],
          jobs["ran_twice_to_end"], jobs["handed_on"], num(data["worker_s"], 0),
          ratio(data["worker_s_vs_fixed"])]], "r" * 9))
    page.add("## Goals", "Every goal met: no job lost, failed or run twice to its end; the "
             "stopped supervisors exited 0; the fleet had the workers asked for, and came back "
             "to the fewest." if not data["missed"] else
             "Missed:\n\n" + "\n".join(f"- {goal}" for goal in data["missed"]))
    page.plot(Plot("autoscale-live.png", "workers wanted, run and serving through the step",
                   _live_plot(data), (8.0, 3.4)))
    return page


def _live_plot(data: dict[str, Any]) -> Callable[[Any], None]:
    def draw(fig: Any) -> None:
        ax = fig.add_subplot()
        points = data["timeline"]
        at = [p["at"] for p in points]
        ax.step(at, [p["wanted"] for p in points], where="post", label="wanted (beat)")
        ax.step(at, [p["replicas"] for p in points], ":", where="post",
                label="supervisors running")
        ax.step(at, [p["current"] for p in points], "--", where="post",
                label="workers serving (beat)")
        ax.plot(at, [p["need"] for p in points], color="tab:gray", linewidth=0.7,
                label="need (rate foreseen)")
        ax.plot(at, [p.get("hold", 0) for p in points], color="tab:olive", linewidth=0.7,
                label="need (rate settled)")
        for phase in ("high", "down"):
            ax.axvline(data["phases_at"][phase], color="k", alpha=0.3, linewidth=0.8)
        ax.set_xlabel("seconds")
        ax.set_ylabel("workers")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    return draw


RENDERERS = {"autoscale": live, "autoscale_sim": autoscale}
