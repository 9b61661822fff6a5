"""The ``lanes`` click group and what its commands share: a Redis client for the
app Celery loaded, tables, numbers and spans for people."""
from __future__ import annotations

import json
import os
import re
import sys
from datetime import datetime, timezone
from typing import Any, Iterable, Sequence

import click
import redis

from tasks.broker.outage import OUTAGE
from tasks.broker.store import app_redis_url, connect
from tasks.errors import GpulanesError


class LanesGroup(click.Group):
    """A click group that turns gpulanes and Redis errors into clean CLI errors."""

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except GpulanesError as exc:  # a bad field, a full lane, a failed job
            raise click.ClickException(str(exc)) from exc
        except (redis.RedisError, *OUTAGE) as exc:
            url = ctx.obj.app.conf.broker_url if ctx.obj else "the broker URL"
            raise click.ClickException(
                f"cannot talk to Redis at {url} ({type(exc).__name__}: {exc}); "
                "is the broker running?") from exc


def _client(ctx: click.Context) -> redis.Redis:
    """A Redis client for the broker of the app Celery loaded (``-A``)."""
    conf = ctx.obj.app.conf
    return connect(app_redis_url(conf), conf.broker_transport_options.get("master_name"),
                   timeout_s=conf.redis_socket_timeout)


def table(headers: Sequence[str], rows: Iterable[Sequence[Any]]) -> str:
    """Plain-text columns under a dashed rule, each as wide as its widest cell."""
    cells = [[str(h) for h in headers]] + [[str(c) for c in row] for row in rows]
    widths = [max(len(row[i]) for row in cells) for i in range(len(headers))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(row, widths)).rstrip() for row in cells]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


def number(value: float) -> str:
    """A number without float noise: 3600, 12.5, -0.125."""
    text = f"{value:.3f}".rstrip("0").rstrip(".")
    return "0" if text == "-0" else text


def plural(count: float, noun: str, nouns: str | None = None) -> str:
    """``count`` and ``noun``, in the plural unless it is one: 1 job, 3 jobs, 0.5 seconds."""
    return f"{number(count)} {noun if abs(count) == 1 else nouns or noun + 's'}"


def duration(seconds: float) -> str:
    """A span for people: 0s, 850ms, 16.8s, 12.5min, 24.0h."""
    if seconds <= 0:
        return "0s"
    if seconds < 1:
        return f"{seconds * 1000:.0f}ms"
    if seconds < 60:
        return f"{seconds:.1f}s"
    return f"{seconds / 60:.1f}min" if seconds < 3600 else f"{seconds / 3600:.1f}h"


class Duration(click.ParamType):
    """A span given with its unit, ``90s``, ``15m``, ``2h`` or ``7d``, as seconds: a bare
    number is refused (is ``7`` seconds or days? for a command that deletes, ask)."""

    name = "duration"
    UNITS_S = {"s": 1, "m": 60, "h": 3600, "d": 86400}

    def convert(self, value: Any, param: click.Parameter | None,
                ctx: click.Context | None) -> float:
        if isinstance(value, (int, float)):
            return float(value)
        found = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([smhd])\s*", str(value))
        if not found:
            self.fail(f"{value!r} is not a duration like 90s, 15m, 2h or 7d", param, ctx)
        return float(found[1]) * self.UNITS_S[found[2]]


def iso_time(epoch_s: float) -> str:
    """A Unix time as ISO 8601 in UTC, to the second."""
    return datetime.fromtimestamp(epoch_s, timezone.utc).isoformat(timespec="seconds")


def _echo_json(data: Any) -> None:
    click.echo(json.dumps(data, indent=2))


@click.group(cls=LanesGroup)
def lanes() -> None:
    """gpulanes: status, jobs, a local cluster, metrics, accounts, dead letters."""
    # The models of GPULANES_MODELS import from the current folder, as in the workers
    # (``python -m celery``); the ``celery`` script puts only its own folder on the path.
    if os.getcwd() not in sys.path and "" not in sys.path:
        sys.path.append(os.getcwd())
