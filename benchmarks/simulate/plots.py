"""PNG plots of a scenario: waits over time per lane (both modes), and the policy's
mode changes with the expected waits beat measured. matplotlib's Agg backend: no
display needed."""
from __future__ import annotations

from pathlib import Path
from typing import Any, Mapping

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from routing.names import LANES  # noqa: E402

COLORS = {"fast": "tab:red", "standard": "tab:blue", "relaxed": "tab:green"}
STYLES = {"gpulanes": "-", "plain": ":"}


def _waits(ax: Any, series: Mapping[str, Mapping[str, Any]]) -> None:
    for mode, found in series.items():
        for lane in LANES:
            points = found["waits"][lane]
            if points:
                ax.plot([p[0] for p in points], [p[2] for p in points], STYLES[mode],
                        color=COLORS[lane], label=f"{lane} p95 ({mode})")
    ax.set_ylabel("wait (s), by submit time")
    ax.set_yscale("symlog", linthresh=1.0)
    ax.legend(fontsize=7, ncol=2)
    ax.grid(alpha=0.3)


def _policy(ax: Any, rounds: list[dict], budgets_s: Mapping[str, float]) -> None:
    times = [r["t"] for r in rounds]
    for offset, lane in enumerate(("fast", "standard")):
        ax.step(times, [offset * 1.5 + (lane in r["overloaded"]) for r in rounds], where="post",
                color=COLORS[lane], label=f"{lane} overloaded")
    twin = ax.twinx()
    for lane, budget_s in budgets_s.items():
        twin.plot(times, [r["expected_wait_s"][lane] / budget_s for r in rounds],
                  color=COLORS[lane], alpha=0.35, linewidth=0.8)
    twin.set_ylabel("expected wait / budget (faint)")
    ax.set_yticks([0, 1, 1.5, 2.5], ["fast off", "fast on", "standard off", "standard on"])
    ax.set_xlabel("simulated seconds")
    ax.legend(fontsize=7, loc="upper left")


def plot_scenario(name: str, series: Mapping[str, Mapping[str, Any]],
                  budgets_s: Mapping[str, float], folder: Path) -> Path:
    """Write ``<folder>/<name>.png``; returns its path."""
    folder.mkdir(parents=True, exist_ok=True)
    fig, (top, bottom) = plt.subplots(2, 1, figsize=(10, 7), sharex=True,
                                      gridspec_kw={"height_ratios": [3, 2]})
    _waits(top, series)
    top.set_title(f"{name}: p95 wait per lane (solid: gpulanes, dotted: plain lanes)")
    rounds = series.get("gpulanes", {}).get("rounds") or []
    if rounds:
        _policy(bottom, rounds, budgets_s)
    fig.tight_layout()
    path = folder / f"{name}.png"
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path
