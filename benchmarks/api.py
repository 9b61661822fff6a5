"""What the HTTP front door costs a submit: ``POST /v1/predictions`` against
``submit()`` called in-process, in latency and in submits per second.

``python benchmarks/api.py`` starts an embedded Redis in a short temporary folder (no
workers: the jobs are published, never run), a thread standing in for beat (a fresh
snapshot every second, so every submit routes through ``decide()``), and two API
servers, ``celery -A tasks lanes api`` as an operator runs it, one process each. Both
sides submit the same job: ``echo`` (a class model, no weights), tier standard, on
the ``mega`` plan: the API takes the plan from the caller's key, ``submit()`` is
given ``plan=PLANS["mega"]``, so admission and the prediction's record are in both.

No account may pass its plan's limits (12 jobs admitted at once), or its jobs would
be parked or refused: each side spreads its submits over ``--accounts`` accounts
(a key each, every one on ``mega``), each used by one caller only, and every round
starts on an emptied Redis (its lanes, admissions and records; the keys, the
snapshot, the lanes' bindings and the accounts' fast time stay). The lanes' depth
limits are raised out of reach, and each lane (and each worker's own queue of it
that the snapshot names) is bound to its exchange as a worker taking from it binds
it (with none bound, every publish would read the bindings). A round counts any
submit parked or refused, which should be none.

1. Latency, one call at a time, the four kinds interleaved (their order turning
   each time): ``submit()`` in this process, until it returns (its result dropped,
   as the API drops it); the POST through a keep-alive httpx client to one API
   process, until its 201 is read; the floor of an authenticated call, the GET of a
   prediction nobody made (the key from the server's memory, one Redis read, a 404
   of a few bytes); and ``GET /v1/models`` (the key, no Redis, every model's input
   schema). What HTTP adds is the POST's p50 (p99) less ``submit()``'s.
2. Throughput, in ``--rounds`` rounds of every mode back to back (the order turning
   each round, one unrecorded warm-up round first): ``submit()`` in a loop in 1 and
   in 2 processes, and the POST against 1 and 2 API processes, driven by
   ``--clients`` client processes of ``--concurrency`` requests in flight each,
   split evenly between the servers (``benchmarks/api_wire.py``: by default
   hand-written HTTP/1.1 on keep-alive connections, the least CPU a client can cost;
   ``--client httpx``: httpx's ``AsyncClient``). Per mode: submits per second, the
   CPU per submit of the processes that submit (the loops, or the API servers) and
   of the HTTP clients, and Redis' commands and CPU per submit (``INFO
   commandstats``, ``INFO cpu``). The ratios are the API's rate over ``submit()``'s
   with as many processes; the goals judge the median of the rounds' ratios. The
   clients share the machine's cores with the servers: with few cores the API's rate
   is held down by its own clients, which ``submit()``'s loops never pay; the CPU
   per submit is the figure that does not depend on it.

Goals (reported, never asserted): HTTP adds at most 2 ms at the median; the API
submits at least 0.5x as fast as ``submit()`` from as many processes.
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Any

if not __package__:  # run as a script: make the project importable
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from benchmarks import api_events  # noqa: E402
from benchmarks.api_figures import (  # noqa: E402
    KINDS, LATENCY_HEADERS, MODES, THROUGHPUT_HEADERS, latency_figures, latency_rows,
    mode_name, throughput_figures, throughput_rows, verdict_lines, verdicts)
from benchmarks.api_load import (  # noqa: E402
    MODEL, PLAN, TIER, Processes, bind_lanes, make_keys, merged, parked, poster, reset,
    submitter, warm_keys)
from benchmarks.api_wire import BODY, CREATE_PATH, MODELS_PATH, SENDERS  # noqa: E402
from benchmarks.common import PROMPT, finish, json_option, markdown_table, run_private  # noqa: E402

HEARTBEAT_S = 1
#: Depth limits out of reach: a round's jobs are never taken, and must never be refused.
DEPTHS = "fast=10000000,standard=10000000,relaxed=10000000"
#: Jobs an account may have admitted at once on ``mega``, less a margin.
PER_ACCOUNT = 10
WARMUP_S = 1.0
#: Each kind of HTTP call of the latency phase: its method, path and status.
CALLS = {"http_submit": ("POST", CREATE_PATH, 201),
         "http_floor": ("GET", "/v1/predictions/00000000-0000-0000-0000-000000000000", 404),
         "http_models": ("GET", MODELS_PATH, 200)}


# --- 1. latency ---------------------------------------------------------------------------
def latency(client: Any, url: str, accounts: list[str], keys: list[str],
            samples: int) -> tuple[dict[str, list[float]], dict[str, list[float]], int]:
    """Milliseconds of each kind of call, one at a time, the kinds interleaved, and of
    this thread's CPU in each (the caller's own work); the size of ``GET /v1/models``'
    answer in bytes."""
    import httpx

    from tasks.api import submit
    from tasks.jobs.plans import PLANS

    plan, ms = PLANS[PLAN], {kind: [] for kind in KINDS}
    cpu_ms: dict[str, list[float]] = {kind: [] for kind in KINDS}
    with httpx.Client(base_url=url, timeout=60) as http:
        def call(kind: str, i: int) -> None:
            account, auth = accounts[i % len(accounts)], {
                "Authorization": f"Bearer {keys[i % len(keys)]}"}
            if kind == "submit":
                submit(model=MODEL, text=PROMPT, tier=TIER, account=account, plan=plan)
                return
            method, path, status = CALLS[kind]
            made = http.request(method, path, headers=auth,
                                json=BODY if method == "POST" else None)
            if made.status_code != status:
                raise SystemExit(f"benchmarks/api.py: {kind}: {made.status_code} {made.text}")

        def timed(kind: str, i: int) -> None:
            began, cpu = time.perf_counter(), time.thread_time()
            call(kind, i)  # a submit's result is dropped in the call, as the API drops it
            ms[kind].append((time.perf_counter() - began) * 1000)
            cpu_ms[kind].append((time.thread_time() - cpu) * 1000)

        reset(client)
        for i in range(min(len(accounts), 50)):  # warm-up: imports, connections, keys
            for kind in KINDS:
                call(kind, i)
        reset(client)
        for i in range(samples):
            if i and i % (len(accounts) * PER_ACCOUNT // 2) == 0:
                reset(client)  # two submits per sample: no account past its limit
            turn = i % len(KINDS)
            for kind in KINDS[turn:] + KINDS[:turn]:
                timed(kind, i)
        models = http.get(MODELS_PATH, headers={"Authorization": f"Bearer {keys[0]}"})
    return ms, cpu_ms, len(models.content)


# --- 2. throughput -----------------------------------------------------------------------
def cpu_s(pids: list[int]) -> float:
    """User + system CPU seconds of ``pids`` so far."""
    import psutil

    return sum(sum(psutil.Process(pid).cpu_times()[:2]) for pid in pids)


class Load:
    """The processes that submit: 2 calling ``submit()``, ``clients`` HTTP clients."""

    def __init__(self, accounts: list[str], keys: list[str], clients: int,
                 concurrency: int, how: str) -> None:
        self.concurrency = concurrency
        self.submitters = Processes(submitter, [(accounts,)] * 2, "submit")
        self.clients = Processes(poster, [(keys, concurrency, how)] * clients, "client")

    def ask(self, kind: str, side: str, n: int, urls: list[str], seconds: float) -> list[Any]:
        """Tell the processes of mode (``side``, ``n``) ``kind`` (ready, go); their answers."""
        processes, orders = self._orders(kind, side, n, urls, seconds)
        return processes.ask(orders)

    def _orders(self, kind: str, side: str, n: int, urls: list[str],
               seconds: float) -> tuple[Processes, list[tuple[Any, ...]]]:
        if side == "submit":
            return self.submitters, [(kind, i, n, seconds) for i in range(n)]
        slots = self.concurrency * len(self.clients.conns)
        return self.clients, [(kind, urls[:n], i * self.concurrency, slots, seconds)
                              for i in range(len(self.clients.conns))]

    def stop(self) -> None:
        self.submitters.stop()
        self.clients.stop()


def one_round(client: Any, load: Load, servers: list[Any], side: str, n: int,
              seconds: float, accounts: list[str], fresh: bool = True) -> dict[str, Any]:
    """One mode for ``seconds`` on an emptied Redis (``fresh``; else the caller emptied it):
    what the load answers, the API servers' CPU, Redis' commands and CPU, and the jobs
    parked."""
    from benchmarks.perjob import window

    if fresh:
        reset(client)
    urls, pids = [s.url for s in servers[:n]], [s.proc.pid for s in servers[:n]]
    load.ask("ready", side, n, urls, seconds)
    answers, before = [], cpu_s(pids) if side == "api" else 0.0
    spent = window(client, lambda: answers.append(merged(load.ask("go", side, n, urls,
                                                                  seconds))))
    found = answers[0]
    servers_s = cpu_s(pids) - before if side == "api" else found["cpu_s"]
    return {"side": side, "processes": n, **found, "submitting_cpu_s": servers_s,
            "client_cpu_s": found["cpu_s"] if side == "api" else 0.0,
            "redis_commands": dict(spent.calls), "redis_cpu_s": spent.cpu_s,
            "parked": parked(client, accounts)}


def throughput(client: Any, load: Load, servers: list[Any], args: argparse.Namespace,
               accounts: list[str]) -> list[dict[str, Any]]:
    """Every mode's rounds, the order turning each round; a warm-up round first."""
    round_s = args.seconds / args.rounds
    for side, n in MODES:
        one_round(client, load, servers, side, n, min(WARMUP_S, round_s), accounts)
    rounds = []
    for r in range(args.rounds):
        for side, n in (MODES if r % 2 == 0 else MODES[::-1]):
            rounds.append({"round": r, **one_round(client, load, servers, side, n, round_s,
                                                   accounts)})
        print(f"  round {r}: " + ", ".join(
            f"{mode_name(x['side'], x['processes'])} {x['submits_s']:.0f}/s"
            for x in rounds if x["round"] == r), file=sys.stderr, flush=True)
    return rounds


# --- the run ------------------------------------------------------------------------------
def benchmark(args: argparse.Namespace, state: Path) -> dict[str, Any]:
    """Start Redis, the snapshot writer, two API servers and the load; measure; stop all."""
    from benchmarks.submit import SnapshotWriter, fake_snapshot
    from gpu_worker.redis_server import EmbeddedRedis
    from tests.harness.http import ApiServer

    server = EmbeddedRedis(state).start()
    writer, servers, load = SnapshotWriter(server.client()), [], None
    try:
        client = server.client()
        writer.write()
        writer.start()
        bind_lanes(client, list(fake_snapshot(time.time())["workers"]))
        accounts, keys = make_keys(client, args.accounts)
        for i in range(2):
            servers.append(ApiServer(state / "logs", name=f"api{i}").start())
        load = Load(accounts, keys, args.clients, args.concurrency, args.client)
        warm_keys([api.url for api in servers], keys)
        print("  latency, one call at a time...", file=sys.stderr, flush=True)
        ms, cpu_ms, models_bytes = latency(client, servers[0].url, accounts, keys,
                                           args.samples)
        rounds = throughput(client, load, servers, args, accounts)
        streamed = None if not args.streams else api_events.measure(
            client, servers, state, args, lambda fresh: one_round(
                client, load, servers, "api", 1, args.stream_seconds, accounts, fresh))
    finally:
        if load is not None:
            load.stop()
        for api in servers:
            api.stop()
        writer.stop()
        server.stop()
    figures = {"latency": latency_figures(ms, cpu_ms),
               "throughput": throughput_figures(rounds)}
    return {"config": {**config(args), "models_bytes": models_bytes}, **figures,
            "goals": verdicts(figures["latency"], figures["throughput"]), "rounds": rounds,
            "events": streamed}


def config(args: argparse.Namespace) -> dict[str, Any]:
    """What the run was asked to do."""
    return {"seconds_per_mode": args.seconds, "rounds": args.rounds, "samples": args.samples,
            "accounts": args.accounts, "clients": args.clients,
            "concurrency": args.concurrency, "client": args.client, "model": MODEL,
            "tier": TIER, "plan": PLAN, "streams": args.streams, "hooks": args.hooks,
            "outage_s": args.outage, "stream_seconds": args.stream_seconds}


def report(figures: dict[str, Any]) -> None:
    """The tables and the verdicts, printed."""
    print(markdown_table(LATENCY_HEADERS, latency_rows(figures["latency"])))
    print()
    print(markdown_table(THROUGHPUT_HEADERS, throughput_rows(figures["throughput"])))
    print("\n".join(verdict_lines(figures["goals"])))
    if bad := {name: m["errors"] + m["parked"]
               for name, m in figures["throughput"]["modes"].items()
               if m["errors"] or m["parked"]}:
        print(f"WARNING: submits refused or parked: {bad}; see the rounds' errors "
              "(more --accounts?)")
    if figures.get("events"):
        print("\n".join(api_events.report_lines(figures["events"])))
    print(f"total wall time {figures['wall_s']:.1f}s")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """The command line."""
    parser = argparse.ArgumentParser(prog="python benchmarks/api.py", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    add = parser.add_argument
    add("--seconds", type=float, default=16.0,
        help="seconds of load per throughput mode, over all its rounds (default: 16)")
    add("--rounds", type=int, default=8, help="interleaved rounds (default: 8)")
    add("--samples", type=int, default=2000,
        help="latency samples of each kind of call (default: 2000)")
    add("--accounts", type=int, default=1000,
        help="accounts (a key each) the submits are spread over (default: 1000)")
    add("--clients", type=int, default=2, help="HTTP client processes (default: 2)")
    add("--concurrency", type=int, default=8,
        help="requests in flight per client process (default: 8)")
    add("--client", choices=SENDERS, default="raw",
        help="how the client processes send: raw (hand-written HTTP/1.1 on keep-alive "
             "connections, the least CPU) or httpx (its AsyncClient); default: raw")
    add("--streams", type=int, default=1000,
        help="event streams held open in the rounds with streams (0: no events part; "
             "default: 1000)")
    add("--stream-seconds", type=float, default=6.0,
        help="seconds of each round of submits with and without the streams (default: 6)")
    add("--hooks", type=int, default=100,
        help="webhooks sent through the receiver's outage (default: 100)")
    add("--outage", type=float, default=30.0,
        help="seconds the webhooks' receiver is down (default: 30)")
    json_option(parser, "api")
    args = parser.parse_args(argv)
    if min(args.rounds, args.samples, args.accounts, args.clients, args.concurrency) < 1 \
            or args.seconds <= 0:
        parser.error("every count must be at least 1, and --seconds above 0")
    if args.accounts < 2 * args.clients * args.concurrency:
        parser.error("--accounts must be at least twice --clients x --concurrency")
    return args


def main(argv: list[str] | None = None) -> int:
    """Run the benchmark, print the tables and the verdicts; 130 after Ctrl-C."""
    args = parse_args(argv)
    figures = run_private("gl-api-", lambda state: benchmark(args, state),
                          "Redis and the API servers are stopped", HEARTBEAT_S=HEARTBEAT_S,
                          MAX_DEPTH=DEPTHS, WEBHOOK_ALLOW_PRIVATE="1")
    return finish(figures, report, args.json)


if __name__ == "__main__":
    sys.exit(main())
