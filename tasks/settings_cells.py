"""Cells: ``GPULANES_BROKER_URL`` naming several Redis instances, one per pool of workers.

One Redis carries a few thousand GPUs' jobs (``docs/scaling.md``). Past that, the broker
URL names *cells* as ``pool=url`` pairs, separated by commas or spaces::

    GPULANES_BROKER_URL="gpu-a=redis://r1:6379/0, gpu-b=redis://r2:6379/0"

Each cell is a whole gpulanes cluster on its own Redis: its lanes, workers, runs,
results and beat. A worker and beat use the cell of their pool (``GPULANES_POOL``), else
the first named; a submitter publishes each job to the cell of its model
(``tasks.broker.cells``). Cells are numbered in the order named, and a job's id names
its cell by that number: a new cell goes at the end of the list.
"""
from __future__ import annotations

import re

#: The most cells a broker URL names (a job id carries its cell's number in a byte).
MOST_CELLS = 256
#: One cell: a pool's name (a DNS label, as ``GPULANES_POOL``), ``=``, a Redis URL.
CELL = re.compile(r"([a-z0-9](?:[-a-z0-9]{0,61}[a-z0-9])?)=([a-z][a-z0-9+.-]*://\S+)")


def parse_cells(raw: str) -> dict[str, str]:
    """The cells ``raw`` names ({pool: URL}, in order); {} when it is one URL.
    ``ValueError`` saying what is wrong with a list of cells."""
    parts = [part for part in re.split(r"[,\s]+", raw.strip()) if part]
    if not any("=" in part.split("://", 1)[0] for part in parts):
        return {}
    cells: dict[str, str] = {}
    for part in parts:
        found = CELL.fullmatch(part)
        if found is None:
            raise ValueError(f"{part!r} is not a cell: cells are pool=url pairs (a pool's "
                             "name, lower-case letters, digits and '-'), separated by commas")
        name, url = found.groups()
        if name in cells:
            raise ValueError(f"cell {name!r} is named twice")
        cells[name] = url
    if len(cells) > MOST_CELLS:
        raise ValueError(f"{len(cells)} cells: at most {MOST_CELLS}")
    return cells
