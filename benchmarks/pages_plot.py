"""PNG files of the benchmark pages: matplotlib's Agg backend, no display, and no date or
version written into the file, so the same JSON draws the same bytes."""
from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from benchmarks.pages_kit import Plot  # noqa: E402


def save(plot: Plot, path: Path) -> Path:
    """Draw ``plot`` into ``path`` (PNG, 100 dpi); returns ``path``."""
    fig = plt.figure(figsize=plot.size_in)
    try:
        plot.draw(fig)
        fig.tight_layout()
        fig.savefig(path, dpi=100, metadata={"Software": None})
    finally:
        plt.close(fig)
    return path
