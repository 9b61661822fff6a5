"""What a job and a beat round cost as the fleet grows: 10, 100, 1,000 and 10,000 workers.

``python benchmarks/fleet.py`` builds, at each size, what a cluster of that many
workers leaves in a private embedded Redis: every worker's pushed stats (records
shaped like the workers' own), its own queues with jobs in them (published through
the real publish script, so the depths and due indexes are real), jobs in
the shared lanes, and the worker record of beat's previous round. Then it measures:

- ``decide()`` p50/p99, the compact snapshot's bytes, applying a new snapshot, and a
  new members version (``benchmarks.fleet_routing``, the real router; each figure the
  median of three runs with different seeds: one run's p99 swings by half on this
  shared machine, at any fleet size);
- Redis' own time per publish in each lane (``INFO commandstats``, the publish
  script's microseconds per call over a few hundred publishes with the lane limit on;
  each size's Redis data kept in a database of its own so that the sizes take turns);
- a beat round: the heartbeat and the movers as the leader runs them (fenced by its
  epoch), median of several rounds, every worker pushing its stats before each and
  one in ``CHANGING`` pushing changed ones (a busy worker's grow every push; an idle
  one's stay the same). The lanes' budgets are set past the build's time (minutes at
  10,000 workers), so that at every size the rounds find jobs waiting within budget:
  moving overdue jobs costs what it moves (``tasks.broker.moves.MOVES_PER_ROUND`` a
  lane at most), whatever the number of workers.

``--processes N`` also starts a real cluster of N lightweight worker processes
(the ``echo`` model: no weights) with two beats, and reports the round time beat
logs with N live workers pushing their stats, and how many answered.
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path
from typing import Any

if not __package__:  # run as a script: make the project importable
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
import redis  # noqa: E402

from benchmarks.common import finish, json_option, markdown_table, run_private  # noqa: E402
from benchmarks.fleet_cells import CELLS, cells_row  # noqa: E402

SIZES = (10, 100, 1000, 10000)
#: One worker in this many pushes changed stats each round (as a busy one does).
CHANGING = 10
#: The lanes' budgets (``GPULANES_MAX_WAIT_S``): past the build's time at every size.
BUDGETS = "fast=600,standard=1200"
#: Publishes timed per lane and size.
PUBLISHES = 300
ROUNDS = 5
#: The goals at the largest size: (figure, bound, "most" or "least"). The publish's is
#: its Redis time over the smallest size's, in the worst lane; a round's most, the
#: heartbeat's period.
GOALS = (("decide_p99_us", 50.0), ("snapshot_bytes", 16_000), ("apply_ms", 10.0),
         ("round_ms", 200.0), ("round_max_ms", 1000.0), ("publish_ratio", 1.2))
MODELS = [f"model-{i}" for i in range(200)]


def record(i: int, now: float, round_number: int = 0) -> dict[str, Any]:
    """Stats shaped like a worker's own push (``gpu_worker.control.stats_of``) in round
    ``round_number``: one worker in ``CHANGING`` has run jobs since the round before."""
    host = f"gpu{i % 8}@node{i // 8}"
    warm = [MODELS[(i * 7 + k) % len(MODELS)] for k in range(1 + i % 3)]
    lanes = ["fast", "standard", "relaxed"]
    return {"hostname": host, "device": f"cuda:{i % 8}", "incarnation": f"{host}/{1000 + i}/1.0",
            "started_at": 1_700_000_000.0 + i, "at": now,
            "busy_s": {"standard": float(round_number if i % CHANGING == 0 else 0)},
            "in_flight": {"fast": 0, "standard": i % 2, "relaxed": 0},
            "service_ms": {lane: 900.0 + i % 50 for lane in lanes}, "warm_models": warm,
            "loading_models": [], "load_ms": {m: 4000.0 for m in warm}, "memory_mb": 80000,
            "model_mb": {m: 20000 for m in warm},
            "cost_ms": {m: [100.0, 800.0] for m in warm}, "concurrency": 1,
            "queues": [q for lane in lanes for q in (f"{lane}.{host}", lane)], "lanes": lanes,
            "batching": {}, "sick": None, "failures": {}}


def populate(client: Any, app: Any, size: int) -> list[str]:
    """``size`` workers' stats, own queues with jobs, shared jobs; their hostnames."""
    from beat.heartbeat import heartbeat
    from beat.lease import Leadership
    from routing.names import worker_queue
    from tasks.broker.leader import fenced
    from tasks.broker.stats import push_stats
    from tasks.jobs.schema import validate
    from tasks.worker.generate import generate

    client.flushdb()
    now, hosts = time.time(), []
    job = validate("p", tier="standard", account="a", model="demo", seed=1, steps=4,
                   width=64, height=64).encode()
    for i in range(size):
        stats = record(i, now)
        hosts.append(stats["hostname"])
        push_stats(client, stats["hostname"], stats)
        for lane, priority in (("standard", 0), ("relaxed", 9)):
            own = worker_queue(lane, stats["hostname"])
            if own not in app.amqp.queues:  # as the worker declares it (gpu_worker.hooks)
                app.amqp.queues.add(own, exchange=own, routing_key=own)
            generate.apply_async(kwargs={"job": job, "route": {"lane": lane,
                                 "requested_tier": lane}, "submitted_at": now},
                                 queue=worker_queue(lane, stats["hostname"]), priority=priority)
    for lane in ("fast", "standard", "relaxed"):
        for _ in range(100):
            generate.apply_async(kwargs={"job": job, "route": {"lane": lane,
                                 "requested_tier": lane}, "submitted_at": now}, queue=lane)
    push_all(client, size, 0)  # pushed long ago by now: they push again (else unknown)
    lead = Leadership(client)  # beat's rounds write only under a leader's epoch
    with fenced(lead.renew()):
        heartbeat()  # beat's first round: the worker record the next rounds start from
    lead.stop()  # steps down: the rounds measured lead afresh
    return hosts


def publish_us(clients: dict[int, Any]) -> dict[int, dict[str, float]]:
    """Redis' microseconds per publish script call, per fleet size (``clients``: size ->
    a client of the database holding that fleet) and lane, limits on: the median of
    ``ROUNDS`` rounds of ``PUBLISHES``, sizes and lanes taking turns in every round, so
    that the machine's drift falls on every size alike."""
    samples = {size: {lane: [] for lane in ("fast", "standard", "relaxed")} for size in clients}
    for _ in range(ROUNDS):
        for size, client in clients.items():
            for lane, times in samples[size].items():
                times.append(_publishes_us(client, lane))
    return {size: {lane: round(statistics.median(t), 1) for lane, t in lanes.items()}
            for size, lanes in samples.items()}


def _publishes_us(client: Any, lane: str) -> float:
    """Mean Redis microseconds of ``PUBLISHES`` publishes to ``lane`` (relaxed: a heavy
    level); the lane is left as it was (their due index entries stay)."""
    import json
    import uuid

    from routing.policy import publish_limits
    from tasks.broker.keys import lane_keys
    from tasks.broker.publish import Conditions, Message, publish
    from tasks.settings import settings

    message = json.loads(client.lrange("standard", 0, 0)[0])
    key = lane_keys(lane)[-1 if lane == "relaxed" else 0]
    when = Conditions(limits=publish_limits(lane, settings.max_depth[lane] + 10**6, None))
    client.config_resetstat()
    for _ in range(PUBLISHES):
        message["properties"]["delivery_tag"] = str(uuid.uuid4())
        publish(client, Message(lane, key, message, time.time()), when)
    usec = client.info("commandstats")["cmdstat_evalsha"]["usec_per_call"]
    client.ltrim(key, PUBLISHES, -1)
    return usec


def push_all(client: Any, size: int, number: int) -> None:
    """Every built worker's stats of round ``number``, pushed as the workers would, in
    pipelined batches: a round follows the one before within a heartbeat, as beat's do
    (rounds further apart count no miss, and a new leader reads everything again)."""
    from tasks.broker.stats import push_stats

    now = time.time()
    for first in range(0, size, 1000):
        with client.pipeline(transaction=False) as pipe:
            for i in range(first, min(size, first + 1000)):
                stats = record(i, now, number)
                push_stats(pipe, stats["hostname"], stats)
            pipe.execute()


def round_ms(client: Any, size: int = 0) -> tuple[float, float, float]:
    """(median, max) ms of a beat round (heartbeat and movers) run as the leader, the
    ``size`` built workers' stats pushed fresh before each (as live workers push theirs,
    off beat's clock): the fleet's steady state, not its workers dying one round after
    another; and the ms of the round before them, the new leader's first (it reads
    everything once). 0: live workers push their own."""
    from beat.heartbeat import heartbeat
    from beat.lease import Leadership
    from beat.movers import move_queued
    from tasks.broker.leader import fenced

    lead = Leadership(client)
    epoch = lead.renew()
    times = []
    for number in range(ROUNDS + 1):
        push_all(client, size, number)
        began = time.perf_counter()
        with fenced(epoch):
            heartbeat()
            move_queued()
        times.append((time.perf_counter() - began) * 1000)
    lead.stop()
    return statistics.median(times[1:]), max(times[1:]), times[0]


def settled(client: Any, timeout_s: float = 120.0) -> None:
    """Wait until Redis rewrites no file in the background (a build of 10,000 workers
    grows its append-only file past its rewrite size: the child that rewrites it takes a
    core of this machine's few, and the disk, for seconds; a fleet's steady state
    rewrites seldom)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        found = client.info("persistence")
        if not any(found.get(busy) for busy in ("aof_rewrite_in_progress",
                                                "aof_rewrite_scheduled",
                                                "rdb_bgsave_in_progress")):
            return
        time.sleep(0.2)


def live_cluster(processes: int, state: Path) -> dict[str, Any]:
    """``processes`` real worker processes serving ``echo`` (no weights) on the private
    Redis: beat rounds run here as the leader with every worker pushing its stats, and
    ``10 x processes`` echo jobs go through ``submit()``."""
    import json

    from tasks import app, submit
    from tasks.broker.app import redis_client
    from tasks.broker.keys import WORKERS_KEY
    from tasks.dev.cluster import LocalCluster

    began = time.monotonic()
    cluster = LocalCluster(state, workers=processes, device="cpu", beat=False,
                           log_dir=state / "logs").start(app, timeout_s=1800)
    try:
        up_s, client = time.monotonic() - began, redis_client()
        time.sleep(3)  # every worker has pushed its stats since it answered its ping
        median_ms, max_ms, _ = round_ms(client)
        alive = sum(json.loads(w)["alive"] for w in client.hgetall(WORKERS_KEY).values())
        sent = time.perf_counter()
        results = [submit(model="echo", text=f"job {i}", tier=("fast", "standard", "relaxed")[i % 3])
                   for i in range(10 * processes)]
        outputs = [r.get(timeout=600)["output"]["text"] for r in results]
        jobs_s = len(outputs) / (time.perf_counter() - sent)
        return {"processes": processes, "started_s": round(up_s, 1), "alive": alive,
                "round_ms": round(median_ms, 1), "round_max_ms": round(max_ms, 1),
                "jobs": len(outputs), "done_right": outputs == [f"job {i}" for i in
                                                                range(10 * processes)],
                "jobs_per_s": round(jobs_s, 1)}
    finally:
        cluster.stop()


def benchmark(args: argparse.Namespace, state: Path) -> dict[str, Any]:
    from benchmarks.fleet_routing import median_of
    from gpu_worker.redis_server import EmbeddedRedis
    from tasks import app

    server = EmbeddedRedis(state).start()
    try:
        client, rows, kept = server.client(), [], {}
        def measured(size: int) -> dict[str, Any]:
            """Build ``size`` workers, and measure them."""
            populate(client, app, size)
            settled(client)  # measured once the build's own file rewrite is over
            median_ms, max_ms, first_ms = round_ms(client, size)
            return {"workers": size, **median_of(3, size), "round_ms": round(median_ms, 1),
                    "round_max_ms": round(max_ms, 1), "takeover_ms": round(first_ms, 1)}

        for db, size in enumerate(args.sizes, start=1):
            rows.append(measured(size))
            print(f"  {rows[-1]}", file=sys.stderr, flush=True)
            client.swapdb(0, db)  # kept aside: the publishes of all sizes take turns
            kept[size] = redis.Redis(unix_socket_path=str(server.socket), db=db)
        cells = None
        if args.cells:
            first_db = len(args.sizes) + 1
            cells = cells_row(server, client, args.sizes[-1], args.cells, first_db, measured,
                              lambda size: populate(client, app, size), MODELS)
            print(f"  {cells}", file=sys.stderr, flush=True)
            kept["cells"] = redis.Redis(unix_socket_path=str(server.socket), db=first_db)
        for row, (size, lanes) in zip([*rows, cells], publish_us(kept).items()):
            row["publish_us"] = lanes
    finally:
        server.stop()
    report = {"sizes": rows, **judged(rows)}
    if cells is not None:
        found = judged([rows[0], cells])
        report["cells"] = {**cells, "goals": found["goals"], "met": found["met"]}
    if args.processes:
        report["live"] = live_cluster(args.processes, state)
        print(f"  {report['live']}", file=sys.stderr, flush=True)
    return report


def judged(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """Each goal (:data:`GOALS`, at most its bound) judged at the largest size."""
    first, last = rows[0], rows[-1]
    found = {**last, "publish_ratio": max(
        last["publish_us"][lane] / first["publish_us"][lane] for lane in first["publish_us"])}
    return {"goals": {"workers": last["workers"], **dict(GOALS)},
            "met": {name: found[name] <= bound for name, bound in GOALS}}


def report(figures: dict[str, Any]) -> None:
    rows = []
    base = figures["sizes"][0]["publish_us"]
    for r in figures["sizes"]:
        pub = r["publish_us"]
        rows.append([r["workers"], f"{r['decide_p50_us']:.1f} / {r['decide_p99_us']:.1f}", f"{r['snapshot_bytes']:,}",
                     f"{r['apply_ms']:.2f}", f"{r['members_apply_ms']:.1f}",
                     " / ".join(f"{pub[lane]:.1f}" for lane in pub),
                     " / ".join(f"{pub[lane] / base[lane]:.2f}x" for lane in pub),
                     f"{r['round_ms']:.0f} (max {r['round_max_ms']:.0f}; "
                     f"taking over {r.get('takeover_ms', 0):.0f})"])
    print("\n" + markdown_table(["workers", "decide() p50 / p99 us", "snapshot bytes",
                                 "apply ms", "new members ms",
                                 "publish Redis us (fast/std/relaxed)",
                                 f"vs {figures['sizes'][0]['workers']} workers",
                                 "beat round ms (max; a new leader's first)"], rows))
    if live := figures.get("live"):
        print(f"\n{live['processes']} real worker processes (echo model), up in "
              f"{live['started_s']:.0f}s: {live['alive']} alive in beat's record; beat round "
              f"{live['round_ms']:.0f} ms (max {live['round_max_ms']:.0f}); {live['jobs']} jobs "
              f"through submit() at {live['jobs_per_s']:.0f} jobs/s, outputs right: "
              f"{live['done_right']}")
    if cells := figures.get("cells"):
        print(f"\n{cells['workers']:,} workers in {cells['cells']} cells of "
              f"{cells['workers_per_cell']:,}: per cell decide() p99 {cells['decide_p99_us']} us, "
              f"snapshot {cells['snapshot_bytes']:,} B, apply {cells['apply_ms']} ms, beat round "
              f"{cells['round_ms']} ms (max {cells['round_max_ms']}), publish "
              + " / ".join(f"{us:.1f}" for us in cells["publish_us"].values())
              + f" us; choosing the cell p50/p99 {cells['choose_cell_p50_us']} / "
              f"{cells['choose_cell_p99_us']} us; goals "
              + ", ".join(f"{k} {'met' if v else 'NOT met'}" for k, v in cells["met"].items()))
    print(f"\ngoals at {figures['goals']['workers']:,} workers: " + ", ".join(
        f"{name} <= {figures['goals'][name]:g} {'met' if met else 'NOT met'}"
        for name, met in figures["met"].items()))
    print(f"\ntotal wall time {figures['wall_s']:.0f}s")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python benchmarks/fleet.py", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", type=lambda s: [int(x) for x in s.split(",")],
                        default=list(SIZES), help="fleet sizes, comma-separated")
    parser.add_argument("--cells", type=int, default=CELLS,
                        help=f"also spread the largest fleet over this many cells "
                             f"(default {CELLS}; 0: not)")
    parser.add_argument("--processes", type=int, default=0,
                        help="also run a real cluster of this many worker processes (e.g. 64)")
    json_option(parser, "fleet")
    args = parser.parse_args(argv)
    figures = run_private("gl-fleet-", lambda state: benchmark(args, state),
                          "Redis is stopped", HEARTBEAT_S=1, MAX_WAIT_S=BUDGETS,
                          MODELS="demo=gpu_worker.demo_model:load,echo=tasks.models.echo:Echo",
                          WARM_MODELS="echo")
    return finish(figures, report, args.json)


if __name__ == "__main__":
    sys.exit(main())
