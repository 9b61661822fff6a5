"""Pages of models and their weights: cold start, the result cache, class models,
batching, the expected wait, and a fleet of 10 to 1,000 workers."""
from __future__ import annotations

from typing import Any

from benchmarks.common import percentile
from benchmarks.pages_kit import Page, Plot, div, num, pct, ratio, table


def coldstart(data: dict[str, Any]) -> Page:
    """``benchmarks/coldstart.py``: shards behind a slow store, serial or parallel."""
    times = data["load_s"]
    floor = times["another host, floor: largest shard"]
    serial, parallel = (times[f"another host, {how}"] for how in ("serial (1 thread)",
                                                                    "parallel (8 threads)"))
    page = Page(
        "coldstart", "Cold start from a remote store",
        f"A {data['shards']}-shard safetensors checkpoint ({data['shard_mb']:g} MB a shard) "
        f"served over HTTP with {data['latency_ms']:g} ms added to every request, a stand-in "
        "for an object store; gpulanes' store and loader fetch every shard into an empty "
        "cache, verify and load it, with one thread (what a plain loop does) and with "
        f"eight (the default); median of {data['repeats']}. No Celery on either side: the "
        "baseline is the serial load, and the floor is the largest shard fetched alone.",
        f"{num(parallel * 1000, 0)} ms to load on another host (serial "
        f"{num(serial * 1000, 0)} ms)",
        f"parallel {ratio(div(parallel, serial))} of serial; {ratio(div(parallel, floor))} "
        "of its floor")
    rows = [[name, num(t * 1000, 0), ratio(div(t, floor))] for name, t in times.items()]
    return page.add("## Loads", table(["load", "ms", "vs largest shard"], rows, "lrr"),
                    "*First in cluster* reads the manifest from the store first; *another "
                    "host* reads the manifest the cluster pinned in Redis, so its shards "
                    "start at once; *warm cache*: the host already holds the shards.")


def cache(data: dict[str, Any]) -> Page:
    """``benchmarks/cache.py``: the result cache on a stream with repeats."""
    modes, latency, memory = data["modes"], data["latency_ms"], data["memory"]
    off, on = modes["cache off"]["gpu_runs"], modes["cache on"]["gpu_runs"]
    speedup = div(percentile(latency["generation"], 0.5), percentile(latency["hit"], 0.5))
    page = Page(
        "cache", "The result cache",
        f"One CPU worker serves a stream of {data['distinct'] + data['repeats']} seeded "
        f"requests ({data['repeats']} of them repeats) with the cache off, then on; then, "
        "one request at a time, the latency of a generation and of a hit, submit to "
        "`.get()`. Admission is LRU-K with K=2: the first repeat of a request is "
        "generated and admitted, only later ones can hit. The baseline is the same "
        "cluster with the cache off.",
        f"GPU runs saved: {off - on} of {off} ({pct(div(off - on, off))})",
        f"a hit {ratio(speedup, 0)} faster than a generation (p50)")
    page.add("## The stream", table(
        ["mode", "requests", "GPU runs", "served from cache", "joined a run in flight",
         "worker's own run count", "wall s"],
        [[mode, m["requests"], m["gpu_runs"], m["hits"], m["joined"], m["worker_runs"],
          num(m["wall_s"])] for mode, m in modes.items()]))
    page.add("## One request at a time", table(
        ["request", "n", "p50 ms", "p95 ms"],
        [[kind, len(ms), num(percentile(ms, 0.5), 2), num(percentile(ms, 0.95), 2)]
         for kind, ms in latency.items()]))
    return page.add(f"GPU runs saved: {off - on} of {off}; a hit answers {ratio(speedup, 0)} "
                    "faster than a generation (p50). "
                    f"Cache memory: {memory['entries']} entries, "
                    f"{num(memory['entry_bytes'], 0)} B per entry key plus "
                    f"{num(memory['lru_bytes'], 0)} B in the LRU set.")


def models(data: dict[str, Any]) -> Page:
    """``benchmarks/models.py``: a diffusers pipeline and ``echo`` behind the cache."""
    found = data["latency_ms"]
    rows, ratios = [], {}
    for model, ms in found.items():
        run, hit = percentile(ms["run"], 0.5), percentile(ms["hit"], 0.5)
        ratios[model] = div(run, hit)
        rows.append([model, len(ms["run"]), num(run), num(percentile(ms["run"], 0.95)),
                     len(ms["hit"]), num(hit, 2), num(percentile(ms["hit"], 0.95), 2),
                     ratio(ratios[model], 0)])
    page = Page(
        "models", "Models of the class contract",
        "One CPU worker serves a diffusers pipeline (a tiny Stable Diffusion built from "
        "configs with random weights, saved and loaded with diffusers' own code, no "
        "download) and `echo`; one request at a time, each sent twice (two runs, the "
        "second admitted to the cache) and then three more times (hits), submit to "
        "`.get()`. The baseline is the model's own run.",
        f"tiny-sd run {num(percentile(found['tiny-sd']['run'], 0.5), 0)} ms, hit "
        f"{num(percentile(found['tiny-sd']['hit'], 0.5), 2)} ms (p50)",
        f"a hit {ratio(ratios['tiny-sd'], 0)} faster than a run")
    return page.add("## Runs and hits", table(
        ["model", "runs", "run p50 ms", "run p95 ms", "hits", "hit p50 ms", "hit p95 ms",
         "run / hit"], rows))


def batching(data: dict[str, Any]) -> Page:
    """``benchmarks/batching.py``: one worker's jobs/s at several ``max_batch``."""
    config, rows = data["config"], data["rows"]
    base, best = rows[0], max(rows, key=lambda r: r["jobs_per_s"])
    page = Page(
        "batching", "Dynamic batching",
        f"For each `max_batch` a fresh single-worker cluster ({config['device']}) gets the "
        f"same stream of {config['jobs']} seeded demo jobs ({config['steps']} steps at "
        f"{config['size']}×{config['size']}) at once; jobs/s from the first publish to the "
        "last result. Every batched pass is one `generate_batch` call; batch 1 is the "
        "worker exactly as without batching, the baseline.",
        f"{num(best['jobs_per_s'])} jobs/s at max_batch {best['batch']} "
        f"(batch {base['batch']}: {num(base['jobs_per_s'])})",
        f"{ratio(div(best['jobs_per_s'], base['jobs_per_s']))} of max_batch {base['batch']}")
    page.add("## Throughput", table(
        ["max_batch", "jobs", "wall s", "jobs/s", f"vs batch {base['batch']}", "mean batch",
         "model ms per job"],
        [[r["batch"], r["jobs"], num(r["wall_s"]), num(r["jobs_per_s"]),
          ratio(div(r["jobs_per_s"], base["jobs_per_s"])), num(r["mean_batch"], 2),
          num(r["run_ms"])] for r in rows]))
    return page.plot(Plot("batching-rate.png", "jobs per second against max_batch",
                          lambda fig: _bars(fig, [str(r["batch"]) for r in rows],
                                            [r["jobs_per_s"] for r in rows], "max_batch",
                                            "jobs/s"), (6.0, 3.5)))


def _bars(fig: Any, labels: list[str], values: list[float], xlabel: str, ylabel: str) -> None:
    ax = fig.add_subplot()
    ax.bar(labels, values, color="tab:blue")
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.grid(alpha=0.3, axis="y")


def estimate(data: dict[str, Any]) -> Page:
    """``benchmarks/estimate.py``: the expected wait when jobs differ in size."""
    rows = data["scenarios"]
    worst = {how: max(abs(1 - r[f"{how}_s"] / r["actual_s"]) for r in rows)
             for how in ("priced", "counted")}
    page = Page(
        "estimate", "The expected wait when jobs differ in size",
        "One CPU worker and beat at a 1 s heartbeat; jobs of one size run first (the lane's "
        "measured service time is theirs), then jobs of another size are queued at once "
        "and a small probe job follows. Beat's snapshot prices the queued jobs by their "
        "cost; the baseline counts them (depth × service time). Both come from one "
        "snapshot and are compared with the wait the probe then has.",
        "priced estimates " + _span([r["priced_s"] / r["actual_s"] for r in rows]) + " of "
        "the real wait (counted: " + _span([r["counted_s"] / r["actual_s"] for r in rows]) + ")",
        f"off by at most {pct(worst['priced'], 0)} priced, {pct(worst['counted'], 0)} "
        "counted")
    return page.add("## Expected and real waits", table(
        ["queue", "real wait s", "priced s", "priced / real", "counted s", "counted / real"],
        [[f"{r['depth']} {r['queued']} behind {r['recent']}", num(r["actual_s"], 2),
          num(r["priced_s"], 2), ratio(div(r["priced_s"], r["actual_s"])),
          num(r["counted_s"], 2), ratio(div(r["counted_s"], r["actual_s"]))] for r in rows]))


def _span(ratios: list[float]) -> str:
    """``[0.45, 0.9]`` -> ``"0.45x–0.90x"``."""
    return f"{ratio(min(ratios))}–{ratio(max(ratios))}"


def fleet(data: dict[str, Any]) -> Page:
    """``benchmarks/fleet.py``: routing, publishing and beat at 10 to 10,000 workers."""
    sizes = data["sizes"]
    base = sizes[0]["publish_us"]
    page = _fleet_page(sizes).add("## Sizes", table(
        ["workers", "decide() p50 / p99 µs", "snapshot bytes", "apply ms", "new members ms",
         "publish Redis µs (fast / standard / relaxed)", f"vs {sizes[0]['workers']} workers",
         "beat round ms"],
        [[f"{r['workers']:,}", f"{num(r['decide_p50_us'])} / {num(r['decide_p99_us'])}",
          f"{r['snapshot_bytes']:,}", num(r["apply_ms"], 2), num(r["members_apply_ms"]),
          " / ".join(num(r["publish_us"][lane]) for lane in r["publish_us"]),
          " / ".join(ratio(div(r["publish_us"][lane], base[lane])) for lane in base),
          f"{num(r['round_ms'], 0)} (max {num(r['round_max_ms'], 0)})"] for r in sizes]))
    if "goals" in data:
        page.add(f"## Goals at {data['goals']['workers']:,} workers", table(
            ["figure", "goal", "met"],
            [[label, f"≤ {data['goals'][name]:,g}{unit}",
              "yes" if data["met"][name] else "**no**"] for name, label, unit in FLEET_GOALS]))
    if cells := data.get("cells"):
        found = {**cells, "publish_ratio": max(div(cells["publish_us"][lane], base[lane])
                                               for lane in base)}
        page.add(f"## {cells['workers']:,} workers in {cells['cells']} cells", table(
            ["figure (one cell)", "measured", "goal", "met"],
            [[label, f"{num(found[name], PLACES.get(name, 1))}{unit}",
              f"≤ {cells['goals'][name]:,g}{unit}",
              "yes" if cells["met"][name] else "**no**"] for name, label, unit in FLEET_GOALS]),
            f"Each cell holds {cells['workers_per_cell']:,} workers on its own Redis (a "
            "database of the benchmark's, built as a size is); the cells are alike, so one "
            "is measured. A submit chooses its model's cell from every cell's snapshot in "
            f"{num(cells['choose_cell_p50_us'])} µs (p99 {num(cells['choose_cell_p99_us'])}), "
            "before its route in that cell.")
    if live := data.get("live"):
        page.add(f"With real processes: {live['processes']} worker processes (echo model) up "
                 f"in {live['started_s']:.0f} s, {live['alive']} alive in beat's record; a "
                 f"beat round {live['round_ms']:.0f} ms (max {live['round_max_ms']:.0f}); "
                 f"{live['jobs']} jobs through `submit()` at {live['jobs_per_s']:.0f} jobs/s.")
    return page


#: decimals a fleet figure is shown with (else 1)
PLACES = {"snapshot_bytes": 0, "apply_ms": 2, "publish_ratio": 2}
#: the fleet's goals as the page names them: (key, label, unit)
FLEET_GOALS = (("decide_p99_us", "`decide()` p99", " µs"),
               ("snapshot_bytes", "compact snapshot", " bytes"),
               ("apply_ms", "applying a new snapshot", " ms"),
               ("round_ms", "beat round, median", " ms"),
               ("round_max_ms", "beat round, most (the heartbeat)", " ms"),
               ("publish_ratio", "publish's Redis time over the smallest size's", "x"))


def _fleet_page(sizes: list[dict[str, Any]]) -> Page:
    """The page's intro; headline at the largest size, ratio against the smallest."""
    first, last = sizes[0], sizes[-1]
    return Page(
        "fleet", "A fleet of workers",
        "At each size the benchmark builds in a private Redis what such a cluster leaves "
        "there (every worker's stats, its own queues with jobs published through the real "
        "script, beat's worker record) and measures the real router (`decide()`, medians "
        "of three seeded runs), Redis' own time per publish and a beat round as the leader "
        f"runs it. The baseline is the same measurement at {first['workers']} workers.",
        f"`decide()` p99 {num(last['decide_p99_us'])} µs, beat round "
        f"{num(last['round_ms'], 0)} ms at {last['workers']:,} workers",
        f"publish at {last['workers']:,} workers " + " / ".join(
            ratio(div(last["publish_us"][lane], first["publish_us"][lane]))
            for lane in first["publish_us"]) + f" of {first['workers']}")


RENDERERS = {"coldstart": coldstart, "cache": cache, "models": models, "batching": batching,
             "estimate": estimate, "fleet": fleet}
