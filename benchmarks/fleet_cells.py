"""The largest fleet of ``benchmarks/fleet.py`` spread over cells (``tasks.settings_cells``).

Every cell is built as ``fleet.py`` builds a size, with the fleet's workers shared out
among them, each in a database of the private Redis (a Redis instance of its own in a
real fleet: a database's structures and so Redis' time per call are its own). The
cells are alike, so one is measured as ``fleet.py`` measures a size: the router on its
snapshot, a beat round, Redis' time per publish (taking turns with the other sizes).
Then, with all of them named in the broker URL, a submit's choice of cell
(``tasks.broker.cells.cell_of_job``, on each cell's real snapshot) is timed over
:data:`CHOICES` jobs of Zipf-drawn models.
"""
from __future__ import annotations

import random
import time
from typing import Any, Callable, Sequence

from benchmarks.common import percentile

#: Cells the largest fleet is spread over (``--cells``).
CELLS = 8
#: Submits whose choice of cell is timed.
CHOICES = 4000


def cells_row(server: Any, client: Any, size: int, cells: int, first_db: int,
              measured: Callable[[int], dict[str, Any]], build: Callable[[int], Any],
              models: Sequence[str]) -> dict[str, Any]:
    """The figures of ``size`` workers in ``cells`` cells (databases ``first_db`` on):
    those of one cell (``measured``: built and measured as a size), the others only
    built (``build``), and what choosing a cell costs a submit of one of ``models``
    (Zipf-drawn, as the built workers hold them)."""
    per_cell = size // cells
    row: dict[str, Any] = {}
    for i in range(cells):
        if i == 0:
            row.update(measured(per_cell))
        else:
            build(per_cell)
        client.swapdb(0, first_db + i)
    row.update(cells=cells, workers=size, workers_per_cell=per_cell)
    urls = {f"cell-{i}": f"redis+socket://{server.socket}?db={first_db + i}"
            for i in range(cells)}
    row["choose_cell_p50_us"], row["choose_cell_p99_us"] = choice_us(urls, models)
    return row


def choice_us(urls: dict[str, str], models: Sequence[str]) -> tuple[float, float]:
    """p50 and p99 microseconds of ``cell_of_job`` over the cells ``urls`` names, each
    cell's snapshot fresh (a round of its beat just before)."""
    from beat.heartbeat import heartbeat
    from beat.lease import Leadership
    from tasks.broker.app import redis_client
    from tasks.broker.cell import within
    from tasks.broker.cells import cell_of_job
    from tasks.broker.leader import fenced
    from tasks.settings import override
    from tests.harness.fleet import WEIGHTS

    with override(broker_url=", ".join(f"{name}={url}" for name, url in urls.items())):
        for name in urls:
            with within(name):
                lead = Leadership(redis_client())
                with fenced(lead.renew()):
                    heartbeat()
                lead.stop()
        rng, took = random.Random(1), []
        for model in rng.choices(models, WEIGHTS, k=CHOICES // 4):
            cell_of_job(model)  # each cell's snapshot read once, as a process starts
        for model in rng.choices(models, WEIGHTS, k=CHOICES):
            began = time.perf_counter()
            cell_of_job(model)
            took.append((time.perf_counter() - began) * 1e6)
    return round(percentile(took, 0.5), 1), round(percentile(took, 0.99), 1)
