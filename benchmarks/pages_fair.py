"""Pages of fair fast and standard lanes: a flood on a real cluster, and on the simulated
fleet."""
from __future__ import annotations

from typing import Any

from benchmarks.pages_kit import BASELINE, Page, div, num, ratio, table

LANES = ("standard", "fast")


def lane_fairness(data: dict[str, Any]) -> Page:
    """``benchmarks/lane_fairness.py``: a light account's waits while another floods."""
    ours = {lane: data[lane]["gpulanes"] for lane in LANES}
    plain = {lane: data[lane]["plain"] for lane in LANES}
    held = all(f["within_bound"] for f in ours.values())
    page = Page(
        "lane_fairness", "Fair fast and standard lanes",
        f"{data['workers']} gpulanes CPU workers and {data['workers']} plain Celery workers. "
        f"In each lane a light account sends {data['light']} jobs one at a time "
        f"({data['pace_s']:g} s apart), first with the lane to itself, then right after "
        f"another account has sent {data['flood']:,} jobs at once. gpulanes' goal: the "
        "light account's p95 wait flooded within its p95 alone plus one job (the time a "
        "job holds a worker, measured as the flood's drain per job and worker). " + BASELINE,
        f"light p95 flooded {' / '.join(num(ours[lane]['flooded_p95_ms'], 0) for lane in LANES)}"
        f" ms (standard / fast), {'within' if held else 'NOT within'} the bound",
        f"light p95 flooded {ratio(div(plain['standard']['flooded_p95_ms'], ours['standard']['flooded_p95_ms']), 0)} "
        "less than plain FIFO (standard)")
    rows = [[lane, side, num(f["alone_p95_ms"], 0), num(f["flooded_p95_ms"], 0),
             num(f["run_ms"], 1), num(f["service_ms"], 1), num(f["bound_ms"], 0),
             "yes" if f["within_bound"] else "no", num(f["flood_drain_s"], 1)]
            for lane in LANES for side, f in data[lane].items()]
    return page.add("## A light account's waits (ms, submit to start)", table(
        ["lane", "side", "alone p95", "flooded p95", "run", "one job", "alone p95 + one job",
         "within", "flood drained in s"], rows))


def simulate_flood(data: dict[str, Any]) -> Page:
    """``python -m benchmarks.simulate.flood``: the same on the simulated fleet."""
    lanes = data["lanes"]
    flood = next(iter(lanes.values()))["flood_jobs"]
    page = Page(
        "simulate_flood", "A flood on the simulated fleet",
        f"The image-service workload on {data['gpus']:,} simulated GPUs at {data['load']:g}x "
        f"their capacity for {data['minutes']:g} minutes, as it is and with one more account "
        f"sending {flood:,} jobs at once to one lane a third of the way in; gpulanes and "
        "plain lanes (one FIFO list per lane) on the same jobs. The figures are the light "
        "accounts' p95 wait in that lane for jobs submitted while the flood drains; the "
        "goal is the real cluster's: within their p95 without the flood plus one job.",
        "light p95 within the bound: " + ", ".join(
            f"{lane} {'yes' if f['gpulanes']['within_bound'] else 'no'} "
            f"({num(f['gpulanes']['flooded_p95_s'], 1)} s)" for lane, f in lanes.items()),
        "plain lanes: " + ", ".join(
            f"{lane} {num(f['plain']['flooded_p95_s'], 0)} s" for lane, f in lanes.items()))
    rows = [[lane, mode, num(f[mode]["alone_p95_s"], 2), num(f[mode]["flooded_p95_s"], 2),
             num(f[mode]["bound_s"], 2), "yes" if f[mode]["within_bound"] else "no",
             num(f[mode]["heavy_alone_p95_s"], 1), num(f[mode]["heavy_flooded_p95_s"], 1)]
            for lane, f in lanes.items() for mode in ("gpulanes", "plain")]
    return page.add("## The lane's waits (s, p95)", table(
        ["lane", "mode", "light alone", "light flooded", "light alone + one job", "within",
         "heavy alone", "heavy flooded"], rows),
        "Heavy accounts (20 of them send 70% of the jobs) share the flood's level by their "
        "recent usage, so the flood delays them as it does on plain lanes; the light "
        "accounts are the 2,000 others.")


RENDERERS = {"lane_fairness": lane_fairness, "simulate_flood": simulate_flood}
