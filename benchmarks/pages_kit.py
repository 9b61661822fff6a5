"""What every benchmark page is made of: the page, its plots, the stamp line, cells.

Nothing here imports matplotlib: ``pages.py --check`` compares markdown only.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Mapping, Sequence

from benchmarks.common import markdown_table

#: draws one figure's content on a matplotlib ``Figure`` (imported only to draw)
Draw = Callable[[Any], None]

#: the baseline every "plain Celery" figure is measured against
BASELINE = ("The plain side is a separate default Celery app in its own process "
            "(kombu's stock Redis transport, Celery's stock result backend), as a "
            "plain Celery user runs it, on the same machine in the same run.")


@dataclass(frozen=True)
class Plot:
    """One PNG of a page: ``docs/benchmarks/<file>``, drawn by ``draw``."""

    file: str
    alt: str
    draw: Draw
    size_in: tuple[float, float] = (8.0, 4.0)

    def markdown(self) -> str:
        """The image line the page shows."""
        return f"![{self.alt}]({self.file})"


@dataclass
class Page:
    """A benchmark's page and its line in the index."""

    name: str  #: the JSON's stem: docs/results/<name>.json, docs/benchmarks/<name>.md
    title: str
    about: str  #: two or three sentences: what was measured, and how
    headline: str  #: the figure that matters, for the index
    versus: str = "–"  #: the ratio against plain Celery (or the baseline named), for the index
    sections: list[str] = field(default_factory=list)  #: markdown blocks after the intro
    plots: list[Plot] = field(default_factory=list)

    def add(self, *blocks: str) -> Page:
        """Append markdown blocks (tables, notes, image lines); returns the page."""
        self.sections.extend(blocks)
        return self

    def plot(self, plot: Plot) -> Page:
        """Show ``plot`` here on the page; returns the page."""
        self.plots.append(plot)
        return self.add(plot.markdown())


def stamp_line(meta: Mapping[str, Any] | None) -> str:
    """The run's stamp as one line: commit, date, machine, versions."""
    if not meta:
        return "not recorded"
    if meta.get("note"):
        return str(meta["note"])
    machine, versions = meta.get("machine") or {}, meta.get("versions") or {}
    torch = machine.get("torch") or {}
    return (f"commit `{meta.get('commit')}`, {utc(meta.get('date'))}; "
            f"{machine.get('cpus')} × {machine.get('cpu')}, {machine.get('memory_gb')} GiB, "
            f"{machine.get('platform')}; torch {torch.get('version')} on "
            f"{torch.get('device')}; Python {versions.get('python')}, Celery "
            f"{versions.get('celery')}, kombu {versions.get('kombu')}, redis-py "
            f"{versions.get('redis')}")


def utc(date: str | None) -> str:
    """``2026-12-04T02:30:51Z`` -> ``2026-12-04 02:30 UTC``."""
    return f"{date[:10]} {date[11:16]} UTC" if date else "date not recorded"


def short_stamp(meta: Mapping[str, Any] | None) -> str:
    """Commit and day of a run, for the index."""
    if meta and meta.get("committed_in"):
        return f"not stamped; committed in `{meta['committed_in']}`"
    if not meta or not meta.get("date"):
        return "not recorded"
    machine = meta.get("machine") or {}
    return (f"`{meta.get('commit')}`, {str(meta['date'])[:10]}, "
            f"{machine.get('cpus')} CPUs")


def run_block(meta: Mapping[str, Any] | None) -> str:
    """The page's closing section: the stamp and the command that made the figures."""
    line = stamp_line(meta)
    lines = ["## The run", "", line if line.endswith(".") else line + "."]
    if meta and meta.get("command"):
        lines += ["", "```", str(meta["command"]), "```"]
    return "\n".join(lines)


def table(headers: Sequence[str], rows: Sequence[Sequence[Any]], align: str = "") -> str:
    """A markdown table (the benchmarks' own format)."""
    return markdown_table(headers, rows, align)


def num(value: float | None, digits: int = 1) -> str:
    """``1234.5`` -> ``"1,234.5"``; ``"–"`` for none."""
    return "–" if value is None else f"{value:,.{digits}f}"


def ratio(value: float | None, digits: int = 2) -> str:
    """``1.234`` -> ``"1.23x"``; ``"–"`` for none."""
    return "–" if value is None else f"{value:.{digits}f}x"


def pct(value: float | None, digits: int = 1) -> str:
    """``0.123`` -> ``"12.3%"``; ``"–"`` for none."""
    return "–" if value is None else f"{100 * value:.{digits}f}%"


def div(top: float | None, bottom: float | None) -> float | None:
    """``top / bottom``; None when either is missing or ``bottom`` is 0."""
    return None if top is None or not bottom else top / bottom


def generic(name: str, data: dict[str, Any]) -> Page:
    """The page of a result no layout was written for: its figures, flattened."""
    leaves = flatten({key: value for key, value in data.items() if key != "meta"})
    page = Page(name, f"`benchmarks/{name}.py`",
                f"The figures `benchmarks/{name}.py` wrote, as they stand (see the script's "
                "own description for what it measures and how).",
                f"{len(leaves)} figures", "–")
    return page.add("## Figures", table(["figure", "value"],
                                        [[f"`{path}`", str(value).replace("|", "\\|")]
                                         for path, value in leaves], "ll"))


def flatten(value: Any, path: str = "", limit: int = 200) -> list[tuple[str, Any]]:
    """``{"a": {"b": 1}}`` -> ``[("a.b", 1)]``: the scalar leaves, lists of more than
    eight items summarised, at most ``limit`` rows."""
    if isinstance(value, dict):
        rows = [row for key, item in value.items()
                for row in flatten(item, f"{path}.{key}" if path else str(key), limit)]
    elif isinstance(value, list) and (len(value) > 8 or not value):
        rows = [(path, f"{len(value)} items")]
    elif isinstance(value, list):
        rows = [row for i, item in enumerate(value) for row in flatten(item, f"{path}[{i}]")]
    else:
        rows = [(path, round(value, 3) if isinstance(value, float) else value)]
    return rows[:limit]
