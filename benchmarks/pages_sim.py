"""The scheduling simulator's page: per scenario, gpulanes against plain lanes on the
same jobs, and each lane's p95 wait over time."""
from __future__ import annotations

from typing import Any, Callable

from benchmarks.pages_kit import Page, Plot, num, pct, ratio, table

LANES = ("fast", "standard", "relaxed")
#: the simulator's plot style: a colour per lane, a line style per mode
COLORS = {"fast": "tab:red", "standard": "tab:blue", "relaxed": "tab:green"}
STYLES = {"gpulanes": "-", "plain": ":"}


def simulate(data: dict[str, Any], name: str = "simulate") -> Page:
    """``python -m benchmarks.simulate``: every scenario on a simulated fleet, both modes
    (``name``: the page's, of its JSON)."""
    scenarios = data["scenarios"]
    page = _page(data, name)
    page.add("## gpulanes against plain lanes", table(
        ["scenario", "served jobs/s", "standard in budget", "fast in budget",
         "fast in budget, in allowance", "gpulanes worst wait s", "plain p99 wait s"],
        [[name, " / ".join(num(x) for x in v["served_jobs_s"]),
          " / ".join(pct(x) for x in v["standard_within_budget"]),
          " / ".join(pct(x) for x in v["fast_within_budget"]),
          " / ".join(pct(s["modes"][mode]["fast_allowed_within_budget"])
                     for mode in ("gpulanes", "plain")),
          num(v["worst_wait_s"]), num(v["plain_p99_wait_s"])]
         for name, s in scenarios.items() if (v := s["versus"])]),
        "Each figure: gpulanes / plain lanes. *Fast in budget* counts every job sent as fast; "
        "*in allowance* leaves out those its account's own limits sent elsewhere (its fast "
        "seconds spent, or its fast places all taken: they run in relaxed or standard, as a "
        "plan's fast hours run out). The same accounts send every fleet's jobs, so on a "
        "larger fleet each sends more, and more of them run out of fast seconds.")
    page.add("## Waits per lane (s, p50 / p95 / p99)", table(
        ["scenario", "mode", *LANES, "refused", "cold loads", "mode changes/min"],
        [[name, mode, *(_quantiles(f["lanes"][lane]) for lane in LANES), f["refused"],
          f"{f['cold_loads']:,}", f["mode_changes_per_min"]]
         for name, s in scenarios.items() for mode, f in s["modes"].items()], "ll" + "r" * 6))
    prefix = name.replace("_", "-")
    for scenario, found in scenarios.items():
        page.plot(Plot(f"{prefix}-{scenario}.png", f"{scenario}: p95 wait per lane over time",
                       _waits_plot(scenario, found["series"]), (8.0, 3.2)))
    return page


def _page(data: dict[str, Any], page_name: str) -> Page:
    """The page's intro; headline and ratio: served jobs/s where gpulanes gains most."""
    served = {name: s["versus"]["served_jobs_s"] for name, s in data["scenarios"].items()
              if s.get("versus")}
    name, (ours, plain) = max(served.items(), key=lambda item: item[1][0] / item[1][1])
    return Page(
        page_name, f"Scheduling simulator, {data['gpus']:,} GPUs",
        f"A fleet of {data['gpus']:,} simulated GPU workers{_cells(data)} on a virtual clock "
        f"(deterministic for seed {data['seed']}), {data['minutes']:g} simulated minutes "
        "of offered load per scenario, driven through the project's own decisions: the "
        "router, beat's policy, the movers and the health check are the real functions; "
        "the lists, the workers and cold loads are simulated. The baseline, *plain lanes*, "
        "runs the same jobs through three FIFO queues by tier: no routing, no policy, no "
        f"moves, no preemption. Capacity: {num(data['capacity_jobs_s'])} jobs/s with every "
        f"model warm; budgets {_budgets(data)}.",
        f"{name}: gpulanes serves {num(ours)} jobs/s, plain lanes {num(plain)}",
        f"served jobs/s {ratio(ours / plain)} ({name}); "
        f"{min(s[0] / s[1] for s in served.values()):.2f}x at worst")


def _cells(data: dict[str, Any]) -> str:
    """How the fleet is spread over cells, if it is (``--cells``)."""
    cells = data.get("cells")
    if not cells:
        return ""
    sizes = sorted(cell["workers"] for cell in cells)
    return (f" in {len(cells)} cells, each on a Redis of its own with its own beat "
            f"({sizes[0]:,} to {sizes[-1]:,} workers, sized by the load of the models "
            "dealt to it; a model's jobs go to its cell)")


def _budgets(data: dict[str, Any]) -> str:
    budgets = {**data["budgets_s"], "relaxed": data["relaxed_budget_s"]}
    return ", ".join(f"{lane} {seconds:g} s" for lane, seconds in budgets.items())


def _quantiles(found: dict[str, Any]) -> str:
    return "/".join(num(found[q]) for q in ("p50", "p95", "p99"))


def _waits_plot(name: str, series: dict[str, Any]) -> Callable[[Any], None]:
    def draw(fig: Any) -> None:
        ax = fig.add_subplot()
        for mode, found in series.items():
            for lane in LANES:
                points = found["waits"].get(lane) or []
                if points:
                    ax.plot([p[0] / 60 for p in points], [p[2] for p in points],
                            STYLES.get(mode, "--"), color=COLORS[lane],
                            label=f"{lane} ({mode})")
        ax.set_title(f"{name}: p95 wait per lane (solid: gpulanes, dotted: plain lanes)",
                     fontsize=10)
        ax.set_xlabel("simulated minutes, by submit time")
        ax.set_ylabel("wait (s)")
        ax.set_yscale("symlog", linthresh=1.0)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7, ncol=2)
    return draw


RENDERERS = {"simulate": simulate,
             "simulate_10000": lambda data: simulate(data, "simulate_10000")}
