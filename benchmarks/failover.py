"""Redis failover under load: a primary, a replica, three Sentinels, every job counted.

``python benchmarks/failover.py`` runs each scenario on a fresh topology
(``benchmarks/sentinels.py``: a primary and two replicas with AOF on, three Sentinels,
quorum 2, ``--down-after-ms``) and a fresh cluster on it through the ``sentinel://``
URL (``--workers`` CPU workers, ``--beats`` beats, every accepted job, run begun and
settled, and beat's lead confirmed by ``--replicas`` replicas), while small jobs stream in at
``--rate`` per second, tiers in turn, and each worker runs a job of a few seconds,
begun ``--backlog-s`` before the fault (the stream queues behind them meanwhile):

1. **kill**: the primary is SIGKILLed;
2. **freeze**: the primary is SIGSTOPped for ``--freeze-s`` (just past down-after), then
   SIGCONTed: it wakes up a primary still, until the Sentinels demote it;
3. **freeze-long**: the same for ``--long-freeze-s``;
4. **lagging**: the replicas are SIGSTOPped, ``--lag-mb`` MB are written to the primary
   and jobs stream for ``--lag-s`` more, then the primary is SIGKILLed and the replicas,
   that far behind, SIGCONTed.

Each scenario runs in a process of its own (``tasks`` reads its broker URL once).
Every job is counted once the cluster settles (``tests.harness.faults.settle``, and the
runs finished twice by the workers' log: two runs, not a redelivered copy answered
with the result of the one); a watcher (``benchmarks/failover_watch.py``,
read in ``benchmarks/failover_figures.py``) gives the seconds after the fault until
a new primary was named, the old one demoted, submits accepted for good, every
worker running jobs again, a beat leading on the new primary; the epochs led on
either; when each process held connections to which. It prints markdown tables,
writes ``--json``, keeps the logs in ``--logs``, and exits 1 when an accepted job was
lost, failed (a small demo job fails only by the failover's doing), falsely failed
or ran to its end twice, or when two beats lead by their own account at the end.
"""
from __future__ import annotations

import argparse
import gc
import json
import os
import shutil
import signal
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from multiprocessing import get_context
from pathlib import Path
from typing import Any, Callable

if not __package__:  # run as a script: make the project importable
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from benchmarks.common import json_option, markdown_table, run_private, write_json  # noqa: E402
from benchmarks.failover_figures import (  # noqa: E402
    Run,
    TimedStream,
    figures,
    operator_figures,
    read_failover,
)
from benchmarks.failover_watch import Operator, Watcher, worker_processes  # noqa: E402
from benchmarks.sentinels import (  # noqa: E402
    MASTER,
    SentinelCluster,
    SentinelTopology,
    quick_client,
    wait_for,
)
from tests.harness.faults import HEADERS, Counts, settle  # noqa: E402

SCENARIOS = ("kill", "freeze", "freeze-long", "lagging")
#: A job of three or four seconds here: one holds each worker at the fault, so that
#: the stream queues up behind them (a backlog on the primary and its replica).
RUNNING_JOB = dict(steps=150, width=640, height=640)
#: The key the lagging scenario fills the replication stream with.
BALLAST_KEY = "failover:ballast"


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--beats", type=int, default=2)
    parser.add_argument("--rate", type=float, default=20.0, help="jobs offered per second")
    parser.add_argument("--before-s", type=float, default=10.0, help="stream before the fault")
    parser.add_argument("--after-s", type=float, default=20.0,
                        help="stream after the fault (after the wake-up of a frozen primary)")
    parser.add_argument("--replicas", type=int, default=1,
                        help="GPULANES_REDIS_REPLICAS: replicas that confirm each write")
    parser.add_argument("--down-after-ms", type=int, default=3000)
    parser.add_argument("--failover-timeout-ms", type=int, default=10000)
    parser.add_argument("--freeze-s", type=float, default=5.0)
    parser.add_argument("--long-freeze-s", type=float, default=40.0)
    parser.add_argument("--lag-mb", type=int, default=40)
    parser.add_argument("--lag-s", type=float, default=2.0,
                        help="jobs streamed while the replica is frozen (under down-after)")
    parser.add_argument("--backlog-s", type=float, default=1.5,
                        help="from the running jobs' start to the fault (jobs queue meanwhile)")
    parser.add_argument("--settle-s", type=float, default=120.0)
    parser.add_argument("--quick", action="store_true", help="a short run")
    parser.add_argument("--only", action="append", choices=SCENARIOS)
    json_option(parser, "failover")
    parser.add_argument("--logs", type=Path, help="copy every log here, a folder a scenario")
    args = parser.parse_args(argv)
    if args.quick:
        args.rate, args.before_s, args.after_s = 10.0, 4.0, 10.0
        args.long_freeze_s, args.lag_mb, args.settle_s = 12.0, 20, 60.0
    return args


# --- the faults ---------------------------------------------------------------------------
def kill_primary(run: Run) -> None:
    """SIGKILL the primary."""
    run.mark()
    run.topology.server(run.old).kill()


def freeze_primary(run: Run, seconds: float) -> None:
    """SIGSTOP the primary for ``seconds``, then SIGCONT it."""
    run.mark()
    os.kill(run.pid(run.old), signal.SIGSTOP)
    try:
        time.sleep(seconds)  # the freeze itself
    finally:
        os.kill(run.pid(run.old), signal.SIGCONT)


def lag_then_kill(run: Run) -> None:
    """Freeze every replica, write ``--lag-mb`` MB and stream ``--lag-s`` more to the
    primary, SIGKILL it, and let the replicas, that far behind, go on."""
    replicas = [run.pid(port) for port in run.topology.others(run.old)]
    for pid in replicas:
        os.kill(pid, signal.SIGSTOP)
    run.notes["behind_since"] = time.time()
    try:
        quick_client(run.old, 30).set(BALLAST_KEY, b"x" * (run.args.lag_mb << 20))
        time.sleep(run.args.lag_s)  # jobs accepted now reach a replica only after the ballast
        run.notes["lag_mb"] = round(run.topology.lag_bytes(run.old) / 2**20, 1)
        kill_primary(run)
    finally:
        for pid in replicas:
            os.kill(pid, signal.SIGCONT)


FAULTS: dict[str, Callable[[Run], None]] = {
    "kill": kill_primary,
    "freeze": lambda run: freeze_primary(run, run.args.freeze_s),
    "freeze-long": lambda run: freeze_primary(run, run.args.long_freeze_s),
    "lagging": lag_then_kill}


def label(name: str, args: argparse.Namespace, notes: dict[str, Any]) -> str:
    return {"kill": "primary SIGKILL",
            "freeze": f"primary SIGSTOP {args.freeze_s:g}s",
            "freeze-long": f"primary SIGSTOP {args.long_freeze_s:g}s",
            "lagging": f"replica {notes.get('lag_mb', '?')} MB behind, primary SIGKILL"}[name]


# --- one scenario ---------------------------------------------------------------------------
def running_jobs(count: int, timeout_s: float = 60.0) -> list[Any]:
    """Submit ``count`` jobs of a few seconds and return once each has begun."""
    from tasks import submit

    results = [submit(f"running at the fault {i}", tier="fast", **RUNNING_JOB)
               for i in range(count)]
    deadline = time.monotonic() + timeout_s
    while any(r.state == "PENDING" for r in results) and time.monotonic() < deadline:
        time.sleep(0.05)
    return results


def converge(run: Run, timeout_s: float) -> int:
    """Wait until the Sentinels name a new primary and the old one, if it answers, is
    a replica; the new primary's port (the old one's if none was promoted)."""
    try:
        return wait_for(lambda: _converged(run), timeout_s, "the failover to end")
    except TimeoutError:
        return run.topology.master_port() or run.old


def _converged(run: Run) -> int | None:
    master = run.topology.master_port()
    if master in (None, run.old) or run.topology.role(run.old) == "master":
        return None
    return master


def stream_through(run: Run, fault: Callable[[Run], None], operator: Operator) -> TimedStream:
    """Stream ``--before-s``, hold every worker with a longer job, let jobs queue behind
    them ``--backlog-s``, break the primary, stream ``--after-s``."""
    stream = TimedStream().start(run.args.rate)
    time.sleep(run.args.before_s)
    stream.add(running_jobs(run.args.workers), time.time())
    time.sleep(run.args.backlog_s)
    operator.fault()
    fault(run)
    time.sleep(run.args.after_s)  # the stream goes on while the cluster finds its feet
    stream.stop()
    return stream


def scenario(args: argparse.Namespace, name: str, state: Path) -> dict[str, Any]:
    """Run scenario ``name`` on a topology and a cluster of its own in ``state``."""
    topology = SentinelTopology(state / "redis", down_after_ms=args.down_after_ms,
                                failover_timeout_ms=args.failover_timeout_ms)
    os.environ["GPULANES_BROKER_URL"] = topology.url  # before tasks is imported
    with topology, SentinelCluster(state, topology, workers=args.workers,
                                   beats=args.beats) as cluster:
        from tasks import app

        cluster.start(app)
        watcher = Watcher(topology, lambda: processes(cluster)).start()
        operator = Operator(cluster.exporter_port).start()
        run = Run(args, topology, old=topology.master_port())
        stream = stream_through(run, FAULTS[name], operator)
        run.new = converge(run, args.settle_s)
        operator.stop()
        counts = settle(stream, label(name, args, run.notes), quick_client(run.new, 5.0),
                        args.settle_s)
        run.settled_wall, samples = time.time(), watcher.stop()
        read_failover(run)
        report = figures(run, name, stream, counts, samples, cluster)  # results read Redis
        report["timeline"].update(operator_figures(run, operator))
        stream.accepted.clear()
        gc.collect()  # results unsubscribe while Redis still answers, not at exit
    return report


def processes(cluster: SentinelCluster) -> dict[str, int]:
    """Every process of the run that talks to Redis, by name."""
    supervisor = cluster.local.supervisor
    workers = worker_processes(supervisor.pid) if supervisor else {}
    exporter = {"exporter": cluster.exporter.pid} if cluster.exporter else {}
    return {"submitter": os.getpid(), **cluster.beat_pids(), **workers, **exporter}


# --- running and reporting -------------------------------------------------------------------
def leading_at_end(report: dict[str, Any]) -> dict[str, str]:
    """The beats that lead by their own account when every job was counted."""
    return {beat: found["last"] for beat, found in report["beat"]["at_end"].items()
            if (found["last"] or "").startswith("leads")}


def failed(report: dict[str, Any]) -> bool:
    """Whether an accepted job was lost, failed (a job of the demo model fails only by the
    failover's doing), falsely failed, or ran to its end twice, or whether more than one
    beat leads by its own account at the end."""
    counts = report["counts"]
    return bool(counts["lost"] or counts["failed"] or counts["falsely_failed"]
                or counts["duplicated"] or report["ran_twice"]
                or len(leading_at_end(report)) > 1)


def keep_logs(state: Path, dest: Path) -> Path:
    """Copy every log under ``state`` (cluster, servers, Sentinels) to ``dest``."""
    dest.mkdir(parents=True, exist_ok=True)
    for log in state.rglob("*.log"):
        shutil.copy(log, dest / "_".join(log.relative_to(state).parts))
    return dest


def run_one(args: argparse.Namespace, name: str) -> dict[str, Any] | None:
    """Scenario ``name`` in a fresh state folder; its report (None: interrupted)."""
    def bench(state: Path) -> dict[str, Any]:
        report = scenario(args, name, state)
        if args.logs or failed(report):
            dest = args.logs / name if args.logs else Path(f"/tmp/gl-failover-{name}-{os.getpid()}")
            report["logs"] = str(keep_logs(state, dest))
        return report

    return run_private("gl-failover-", bench, "cluster stopped", SENTINEL_MASTER=MASTER,
                       HEARTBEAT_S=1, REDIS_REPLICAS=args.replicas)


def in_own_process(args: argparse.Namespace, name: str) -> dict[str, Any] | None:
    """:func:`run_one` in a fresh interpreter: ``tasks`` reads its broker URL once."""
    with ProcessPoolExecutor(1, mp_context=get_context("spawn"), max_tasks_per_child=1) as pool:
        return pool.submit(run_one, args, name).result()


JOB_HEADERS = (*HEADERS[:9], "ran to the end twice (log)", *HEADERS[9:])
TIME_HEADERS = ("scenario", "new primary named", "old demoted", "submits back",
                "every worker ran a job", "beat leads on new", "exporter back",
                "lanes status answers", "epoch before",
                "epochs led on new", "leads written on the old after promotion (unconfirmed)",
                "beats that lead by their own account at the end")


def job_row(report: dict[str, Any]) -> list[Any]:
    row = Counts(**report["counts"]).row()
    return [*row[:9], report["ran_twice"], *row[9:]]


def time_row(report: dict[str, Any]) -> list[Any]:
    t, beat = report["timeline"], report["beat"]
    cell = lambda s: "never" if s is None else f"{s:.1f}s"  # noqa: E731
    leads = ", ".join(f"{b} {e} @{s}s" for s, b, e in beat["on_new"] if b != "-")
    stale = ", ".join(f"{b} {e} @{s}s" for s, b, e in beat["on_old_after"]) or "none"
    dead = [b for b, found in beat["at_end"].items() if found["lease_thread_died"]]
    leading = ", ".join(f"{b} {said[len('leads '):]}" for b, said in
                        leading_at_end(report).items()) or "none"
    return [report["label"], cell(t["promoted_s"]), cell(t["old_demoted_s"]),
            cell(t["submits_back_s"]), cell(t["workers_ran_s"]), cell(t["beat_leads_s"]),
            cell(t["exporter_back_s"]), cell(t["status_ok_s"]), (beat["before"] or ["", "?"])[1], leads or "none", stale,
            leading + (f" (lease thread dead: {', '.join(dead)})" if dead else "")]


def client_rows(reports: list[dict[str, Any]]) -> tuple[list[str], list[list[Any]]]:
    """Per scenario and process: ``on new at / on old until`` (seconds after the fault)."""
    names = sorted({name for r in reports for name in r["clients"]})
    rows = [[r["label"], *(_client_cell(r["clients"].get(name)) for name in names)]
            for r in reports]
    return ["scenario", *names], rows


def _client_cell(found: dict[str, float | None] | None) -> str:
    if not found:
        return ""
    return f"{found['on_new_s'] if found['on_new_s'] is not None else 'never'} / " \
           f"{found['on_old_until_s'] if found['on_old_until_s'] is not None else '-'}"


def report(reports: list[dict[str, Any]], args: argparse.Namespace) -> None:
    print(f"\n{args.workers} CPU workers, {args.beats} beats, {args.rate:g} jobs/s offered, "
          f"down-after {args.down_after_ms} ms\n")
    print(markdown_table(JOB_HEADERS, [job_row(r) for r in reports]), "\n")
    print("Seconds after the fault:\n")
    print(markdown_table(TIME_HEADERS, [time_row(r) for r in reports], "lrrrrrrrrlll"), "\n")
    print("Connections, seconds after the fault: first to the new primary / last to the old:\n")
    print(markdown_table(*client_rows(reports)))
    for r in reports:
        print(f"\n{r['label']}: errors in the logs after the fault: "
              f"{json.dumps(r['errors'], indent=1) if r['errors'] else 'none'}")
        print(f"beat leads logged after the fault (s, beat, epoch): {r['beat']['logged']}")
        print("submits refused after the fault (from s, to s, how many): "
              f"{r['timeline']['refused'] or 'none'}; why: {r['refusals'] or '-'}")
        if "accepted_while_behind" in r["notes"]:
            print(f"jobs accepted while the replica was behind: "
                  f"{r['notes']['accepted_while_behind']}")
        if r["counts"]["lost_ids"]:
            print(f"lost: {r['counts']['lost_ids'][:10]}")
        if r.get("logs"):
            print(f"logs: {r['logs']}")


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    reports = []
    try:
        for name in args.only or SCENARIOS:
            found = in_own_process(args, name)
            if found is None:
                return 130
            print(markdown_table(JOB_HEADERS, [job_row(found)]).splitlines()[-1], flush=True)
            reports.append(found)
    except KeyboardInterrupt:
        return 130
    report(reports, args)
    write_json(args.json, reports)
    return 1 if any(failed(r) for r in reports) else 0


if __name__ == "__main__":
    sys.exit(main())
