"""``celery -A tasks lanes keys ...``: the API keys that are the accounts of HTTP callers.

Registered on the ``lanes`` group by ``tasks.ops.cli``. A key is shown once, when it is
made; Redis keeps only its hash (``tasks.jobs.apikeys``).
"""
from __future__ import annotations

from dataclasses import asdict

import click

from tasks.ops.group import _client, _echo_json, iso_time, lanes, table


@lanes.group()
def keys() -> None:
    """API keys: each names one account and its plan."""


@keys.command("create")
@click.argument("account")
@click.option("--plan", "plan_name", default=None, help="basic, standard (default), pro, mega.")
@click.option("--json", "as_json", is_flag=True, help="Print JSON instead of text.")
@click.pass_context
def keys_create(ctx: click.Context, account: str, plan_name: str | None, as_json: bool) -> None:
    """A new key for ACCOUNT, shown once: keep it, only its hash is stored."""
    from tasks.jobs.apikeys import create
    from tasks.jobs.plans import DEFAULT_PLAN

    key, record = create(_client(ctx), account, plan_name or DEFAULT_PLAN)
    if as_json:
        _echo_json({"key": key, **asdict(record)})
    else:
        click.echo(f"{key}\n(id {record.id}: account {record.account}, plan {record.plan}; "
                   "shown once, only its hash is stored)")


@keys.command("list")
@click.option("--json", "as_json", is_flag=True, help="Print JSON instead of a table.")
@click.pass_context
def keys_list(ctx: click.Context, as_json: bool) -> None:
    """Every live key, by its id (never the key itself)."""
    from tasks.jobs.apikeys import listed

    records = listed(_client(ctx))
    if as_json:
        _echo_json([asdict(r) for r in records])
    elif not records:
        click.echo("no API keys; `lanes keys create ACCOUNT` makes one")
    else:
        click.echo(table(["id", "account", "plan", "created"],
                         [(r.id, r.account, r.plan, iso_time(r.created_at)) for r in records]))


@keys.command("revoke")
@click.argument("key")
@click.pass_context
def keys_revoke(ctx: click.Context, key: str) -> None:
    """Revoke KEY (the key itself, or its id from `lanes keys list`)."""
    from tasks.jobs.apikeys import revoke

    record = revoke(_client(ctx), key)
    click.echo(f"revoked key {record.id} of account {record.account}")
