"""Figures and tables: a quantile, a markdown table."""
from __future__ import annotations

from typing import Any, Iterable, Sequence


def percentile(values: Sequence[float], q: float) -> float | None:
    """The nearest-rank ``q`` quantile (0..1) of ``values``; None when there are none."""
    if not values:
        return None
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(q * (len(ordered) - 1))))]


def markdown_table(headers: Sequence[str], rows: Iterable[Sequence[Any]],
                   align: str = "") -> str:
    """A markdown table; ``align`` holds ``l`` or ``r`` per column (default: the
    first column left, the others right). An empty cell prints as ``| |``."""
    align = align or "l" + "r" * (len(headers) - 1)
    rule = "|" + "|".join("---:" if a == "r" else "---" for a in align) + "|"
    return "\n".join([table_row(headers), rule, *(table_row(row) for row in rows)])


def table_row(cells: Sequence[Any]) -> str:
    """``["a", "", 3]`` -> ``"| a | | 3 |"``."""
    return "|" + "|".join(f" {cell} " if str(cell) else " " for cell in cells) + "|"
