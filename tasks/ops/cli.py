"""``celery -A tasks lanes ...``: operator commands for lanes, fast-time accounts and dead letters.

Celery loads the ``lanes`` group from the ``celery.commands`` entry point and
hands it the app named by ``-A`` through its CLI context (``ctx.obj.app``).
Celery imports this module for every sub-command, so it imports only light,
config-free modules at the top; the rest load when a command runs.
Every command reads or writes the broker's Redis; bad input and an unreachable
Redis end in a one-line error and a non-zero exit, never a traceback.
"""
from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import click
import redis

from tasks.broker.keys import SNAPSHOT_KEY, WORKERS_KEY
from tasks.errors import InvalidJob
from tasks.ops.group import (
    Duration,
    _client,
    _echo_json,
    iso_time,
    lanes,
    number,
    plural,
    table,
)
from tasks.ops.status import render_status

#: Longest error text shown in the dead-letter table; ``--json`` has it all.
ERROR_CHARS = 60


# --- accounts -----------------------------------------------------------------

@lanes.group()
def accounts() -> None:
    """Fast GPU seconds per account."""


def _parse_seconds(raw: str) -> float:
    try:
        return float(raw)
    except ValueError:
        raise InvalidJob("seconds", f"must be a number, got {raw!r}") from None


def _balance_line(account: str, left: float, exhausted: bool) -> str:
    note = " (exhausted: its fast jobs run in the relaxed lane)" if exhausted else ""
    return f"{account}: {plural(left, 'fast second')} left{note}"


@accounts.command("list")
@click.option("--json", "as_json", is_flag=True, help="Print JSON instead of a table.")
@click.pass_context
def accounts_list(ctx: click.Context, as_json: bool) -> None:
    """Every account with a recorded balance."""
    from tasks.jobs.accounts import balances, exhausted_accounts
    from tasks.settings import settings

    left = balances()
    exhausted = exhausted_accounts()
    rows = [{"account": account, "fast_seconds_left": left[account],
             "exhausted": account in exhausted} for account in sorted(left)]
    if as_json:
        _echo_json(rows)
    elif not rows:
        click.echo(f"no recorded balances; every account starts with "
                   f"{plural(settings.fast_seconds_default, 'fast second')}")
    else:
        click.echo(table(["account", "fast seconds left", "exhausted"],
                         [(r["account"], number(r["fast_seconds_left"]),
                           "yes" if r["exhausted"] else "no") for r in rows]))


@accounts.command("show")
@click.argument("account")
@click.pass_context
def accounts_show(ctx: click.Context, account: str) -> None:
    """Fast seconds ACCOUNT has left.

    An account never charged has the starting balance (GPULANES_FAST_SECONDS_DEFAULT).
    """
    from tasks.jobs.accounts import exhausted_accounts, fast_seconds_left
    from tasks.jobs.schema import check_account

    check_account(account)
    exhausted = account in exhausted_accounts()
    click.echo(_balance_line(account, fast_seconds_left(account), exhausted))


@accounts.command("grant", context_settings={"ignore_unknown_options": True})
@click.argument("account")
@click.argument("seconds")
@click.pass_context
def accounts_grant(ctx: click.Context, account: str, seconds: str) -> None:
    """Add SECONDS (negative to take away) to ACCOUNT's fast time."""
    from tasks.jobs.accounts import exhausted_accounts, grant_fast_seconds

    left = grant_fast_seconds(account, _parse_seconds(seconds))
    exhausted = account in exhausted_accounts()
    click.echo(_balance_line(account, left, exhausted))


# --- dead letters -------------------------------------------------------------

@lanes.group()
def dead() -> None:
    """Jobs that failed for good."""


def _short(text: str, limit: int = ERROR_CHARS) -> str:
    """The first line of ``text``, cut to ``limit`` characters; "..." marks a cut."""
    lines = text.strip().splitlines() or ["-"]
    first = lines[0]
    if len(first) > limit:
        return first[:limit - 3] + "..."
    return first + (" ..." if len(lines) > 1 else "")


def _dead_row(entry: dict[str, Any]) -> tuple:
    route = entry.get("route", {})
    return (entry["job_id"], iso_time(entry["failed_at"]), entry.get("reason", "-"),
            _short(entry.get("error", "")), entry.get("attempts", "-"),
            route.get("requested_tier", entry.get("job", {}).get("tier", "-")),
            route.get("lane", "-"))


@dead.command("list")
@click.option("--json", "as_json", is_flag=True, help="Print JSON instead of a table.")
@click.option("--traceback", "tracebacks", is_flag=True,
              help="Also print each job's traceback summary.")
@click.pass_context
def dead_list(ctx: click.Context, as_json: bool, tracebacks: bool) -> None:
    """Dead jobs, oldest failure first."""
    from tasks.jobs.deadletter import dead_jobs

    entries = dead_jobs(_client(ctx))
    if as_json:
        return _echo_json(entries)
    if not entries:
        return click.echo("no dead jobs")
    click.echo(table(["job id", "failed at", "reason", "error", "attempts",
                      "requested tier", "lane"], map(_dead_row, entries)))
    for entry in entries if tracebacks else ():
        click.echo(f"\n--- {entry['job_id']} ---\n{entry.get('traceback', '(none)')}")


def _pick(client: redis.Redis, job_ids: tuple[str, ...], every: bool) -> dict[str, dict]:
    """The dead entries to requeue, by id; every id must exist before any is requeued."""
    from tasks.jobs.deadletter import dead_jobs

    if every == bool(job_ids):
        raise click.UsageError("give one or more JOB_IDs, or --all")
    entries = {entry["job_id"]: entry for entry in dead_jobs(client)}
    unknown = [job_id for job_id in job_ids if job_id not in entries]
    if unknown:
        raise click.ClickException(f"no dead job {', '.join(map(repr, unknown))}; "
                                   "see `celery -A tasks lanes dead list`")
    return entries if every else {job_id: entries[job_id] for job_id in job_ids}


@dead.command("requeue")
@click.argument("job_ids", metavar="JOB_ID...", nargs=-1)
@click.option("--all", "every", is_flag=True, help="Requeue every dead job.")
@click.pass_context
def dead_requeue(ctx: click.Context, job_ids: tuple[str, ...], every: bool) -> None:
    """Submit dead jobs again in their requested tier; print the task ids."""
    from tasks.jobs.deadletter import requeue

    client = _client(ctx)
    picked = _pick(client, job_ids, every)
    if not picked:
        return click.echo("no dead jobs to requeue")
    for job_id, entry in picked.items():
        try:
            result = requeue(client, job_id)
        except KeyError as exc:  # requeued by someone else meanwhile
            raise click.ClickException(f"no dead job {job_id!r} any more") from exc
        click.echo(f"{result.id}  requeued onto the {entry['job']['tier']} lane")


@dead.command("purge")
@click.option("--older-than", "older_than_s", type=Duration(), metavar="DURATION",
              help="Only jobs that failed more than DURATION ago: 90s, 15m, 2h, 7d.")
@click.option("--all", "every", is_flag=True, help="Every dead job.")
@click.pass_context
def dead_purge(ctx: click.Context, older_than_s: float | None, every: bool) -> None:
    """Remove dead jobs for good; print how many (beat drops those older than
    a week by itself)."""
    from tasks.jobs.deadletter import drop_dead

    if every == (older_than_s is not None):  # a bare `purge` must not mean "everything"
        raise click.UsageError("give --older-than DURATION (e.g. 7d) or --all")
    cutoff = "+inf" if every else time.time() - older_than_s
    removed = drop_dead(_client(ctx), cutoff, calls=None)
    click.echo(f"removed {plural(removed, 'dead job')}")


# --- status -------------------------------------------------------------------

def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value


@lanes.command("status")
@click.option("--json", "as_json", is_flag=True, help="Print the raw snapshot as JSON.")
@click.pass_context
def status(ctx: click.Context, as_json: bool) -> None:
    """Beat's leader, and lanes, pools and workers as of its latest load snapshot."""
    from beat.scaling import read
    from tasks.broker.leader import current
    from tasks.broker.memory import redis_state

    client = _client(ctx)
    raw, records = client.get(SNAPSHOT_KEY), client.hgetall(WORKERS_KEY)
    if raw is None:
        click.echo(f"no load snapshot in Redis (key {SNAPSHOT_KEY}): beat is not running "
                   "or has not ticked yet; start it with `celery -A tasks beat`", err=True)
        ctx.exit(1)
    holder, epoch = current(client)
    snapshot = {**json.loads(raw), "beat": {"leader": holder, "epoch": epoch},
                "workers": {_text(h): json.loads(w) for h, w in records.items()},
                "redis": redis_state(client),  # live: beat cannot write while it refuses
                "pools": read(client)}
    if as_json:
        return _echo_json(snapshot)
    click.echo(render_status(snapshot))


# --- prewarm ------------------------------------------------------------------

def _live_workers(client: redis.Redis, wanted: int) -> dict[str, dict]:
    """The workers that pushed their stats within a heartbeat, as live records. Fewer
    than ``wanted`` found: every worker seen over up to two heartbeats (each pushes once
    per heartbeat; a push late on a busy host misses one reading, not two)."""
    from beat.heartbeat import ask_workers
    from tasks.settings import settings

    deadline, replies = time.monotonic() + 2 * settings.heartbeat_s, {}
    while True:
        replies.update(ask_workers(client))
        if len(replies) >= wanted or time.monotonic() >= deadline:
            break
        time.sleep(0.1)
    return {host: {**reply, "alive": True} for host, reply in replies.items()}


@lanes.command("prewarm")
@click.argument("model")
@click.option("--replicas", type=click.IntRange(min=1), default=1, show_default=True,
              help="How many workers should hold MODEL warm.")
@click.option("--wait", "wait_s", type=click.FloatRange(min=0), default=0.0,
              help="Seconds to wait until the replicas are warm (0: do not wait).")
@click.pass_context
def prewarm(ctx: click.Context, model: str, replicas: int, wait_s: float) -> None:
    """Load MODEL on the least busy workers ahead of traffic."""
    from beat.replicas import prewarm as ask
    from routing.placement import holders, prewarm_targets
    from tasks.settings import settings

    if model not in settings.models:
        raise click.ClickException(f"model: unknown model {model!r}; GPULANES_MODELS knows "
                                   f"{', '.join(sorted(settings.models))}")
    app = ctx.obj.app
    workers = _live_workers(_client(ctx), replicas)
    targets = prewarm_targets(workers, model, replicas)
    if len(holders(workers, model)) + len(targets) < replicas:
        raise click.ClickException(f"only {plural(len(workers), 'worker')} answered; "
                                   f"cannot hold {plural(replicas, 'replica')} of {model}")
    for answer in ask(app, model, targets, reply=True) if targets else []:
        for host, reply in answer.items():
            click.echo(f"{host}: {reply.get('ok') or reply.get('error')}")
    _wait_warm(_client(ctx), model, replicas, wait_s)


def _wait_warm(client: redis.Redis, model: str, replicas: int, wait_s: float) -> None:
    deadline = time.monotonic() + wait_s
    while True:
        warm = [h for h, w in _live_workers(client, replicas).items()
                if model in w.get("warm_models", ())]
        if len(warm) >= replicas or time.monotonic() >= deadline:
            break
        time.sleep(0.5)
    click.echo(f"{model} warm on {plural(len(warm), 'worker')}: {', '.join(sorted(warm)) or '-'}")
    if wait_s and len(warm) < replicas:
        raise click.ClickException(f"{model} is warm on {len(warm)} of "
                                   f"{plural(replicas, 'worker')} "
                                   f"after {wait_s:g}s")


@lanes.command("unpin")
@click.argument("model")
@click.pass_context
def unpin(ctx: click.Context, model: str) -> None:
    """Let the next load of MODEL read the store's manifest (a new version)."""
    from gpu_worker.store import ManifestPins

    if ManifestPins(_client(ctx)).unpin(model):
        click.echo(f"{model}: unpinned; the next load reads the store's manifest and pins it "
                   "(restart the workers that hold it to roll the new version out)")
    else:
        click.echo(f"{model}: was not pinned")


@lanes.command("publish")
@click.argument("folder", type=click.Path(exists=True, file_okay=False, path_type=Path))
@click.argument("name")
@click.option("--store", default=None, help="fsspec URL (default: GPULANES_MODEL_STORE)")
def publish(folder: Path, name: str, store: str | None) -> None:
    """Publish a saved model FOLDER (save_pretrained's output, or a checkpoint) to the
    model store as NAME (a class model's folder, a checkpoint's model name); workers
    fetch it from there, verified, once per host."""
    from gpu_worker.store import publish_folder
    from tasks.errors import ShardError
    from tasks.settings import settings

    url = store or settings.model_store
    if not url:
        raise click.UsageError("no store: pass --store URL or set GPULANES_MODEL_STORE")
    try:
        manifest = publish_folder(folder, url, name)
    except ShardError as exc:
        raise click.ClickException(str(exc)) from exc
    size_mb = sum(shard["size_bytes"] for shard in manifest["shards"]) / 1e6
    files = plural(len(manifest["shards"]), "file")
    click.echo(f"{name}: {files} ({size_mb:.1f} MB) published to {url}; "
               f"`celery -A tasks lanes unpin {name}` if workers loaded an older one")


# register job, cancel, keys, api, submit, up and exporter
from tasks.ops import cli_api, cli_jobs, cli_keys, cli_run  # noqa: E402,F401
