"""``celery -A tasks lanes submit | up | exporter``: run jobs and a cluster from the shell.

Registered on the ``lanes`` group by ``tasks.ops.cli``; heavy imports wait until a
command runs.
"""
from __future__ import annotations

import os
import secrets
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import click

from routing.names import TIERS
from tasks.ops.cli_jobs import follow
from tasks.ops.group import _client, duration, lanes


def _interrupt(*_: Any) -> None:
    raise KeyboardInterrupt


def _wait_for_ctrl_c() -> None:
    """Block until SIGINT or SIGTERM (both end the command cleanly)."""
    signal.signal(signal.SIGTERM, _interrupt)
    try:
        while True:
            time.sleep(3600)
    except KeyboardInterrupt:
        click.echo("\nstopping ...")


# --- submit -------------------------------------------------------------------

@lanes.command("submit")
@click.argument("prompt")
@click.option("--tier", type=click.Choice(TIERS), default="standard", show_default=True)
@click.option("--account", default="anonymous", show_default=True)
@click.option("--model", default="demo", show_default=True)
@click.option("--seed", type=int, default=None, help="Same seed, same image (default: drawn).")
@click.option("--steps", type=int, default=20, show_default=True)
@click.option("--width", type=int, default=256, show_default=True)
@click.option("--height", type=int, default=256, show_default=True)
@click.option("--timeout", "timeout_s", type=click.FloatRange(min=0), default=600.0,
              show_default=True, help="Seconds to wait for the image.")
@click.option("--no-wait", is_flag=True, help="Print the job id and return at once.")
def submit_command(prompt: str, tier: str, account: str, model: str, seed: int | None,
                   steps: int, width: int, height: int, timeout_s: float,
                   no_wait: bool) -> None:
    """Submit one image job for PROMPT; show its progress and its PNG's path."""
    from tasks import submit

    result = submit(prompt, tier=tier, account=account, model=model, seed=seed, steps=steps,
                    width=width, height=height)
    click.echo(f"job {result.id} submitted ({tier})")
    if no_wait:
        return
    out = follow(result, timeout_s, sys.stdout.isatty())
    moved = f", moved down from {out['downgraded_from']} ({out['downgrade_reason']})" \
        if out.get("downgraded_from") else ""
    click.echo(f"image: {out['image']}\nran in the {out['lane']} lane{moved} on "
               f"{out.get('worker', '-')}; waited {duration(out['queued_ms'] / 1000)}, ran "
               f"{duration(out['run_ms'] / 1000)}" + (" (from the cache)" if out["cached"] else ""))


# --- exporter -----------------------------------------------------------------

@lanes.command("exporter")
@click.option("--port", type=click.IntRange(0, 65535), default=9808, show_default=True)
@click.option("--address", default="127.0.0.1", show_default=True,
              help="Address to listen on (0.0.0.0 in a container).")
@click.pass_context
def exporter(ctx: click.Context, port: int, address: str) -> None:
    """Serve Prometheus metrics (http://ADDRESS:PORT/metrics) until Ctrl-C.

    Behind basic auth when GPULANES_EXPORTER_AUTH=user:password is set; without
    it, only on a loopback address.
    """
    from tasks.ops.metrics import serve
    from tasks.settings import settings

    client = _client(ctx)
    client.ping()  # an unreachable Redis is an error now, not at the first scrape
    try:
        server = serve(client, port, address, settings.exporter_auth)
    except PermissionError as exc:
        raise click.ClickException(str(exc)) from exc
    click.echo(f"gpulanes metrics on http://{address}:{server.server_port}/metrics", err=True)
    _wait_for_ctrl_c()
    server.shutdown()
    server.server_close()


# --- up -----------------------------------------------------------------------

def _flower(port: int, env: dict[str, str], log_dir: Path) -> subprocess.Popen:
    from gpu_worker.processes import spawn

    with open(log_dir / "flower.log", "ab") as log:  # the child keeps its own copy
        return spawn([sys.executable, "-m", "celery", "-A", "tasks", "flower",
                      f"--port={port}", "--address=127.0.0.1"], env=env, stdout=log,
                     stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)


@lanes.command("up")
@click.option("--workers", type=click.IntRange(min=1), default=2, show_default=True)
@click.option("--device", type=click.Choice(("auto", "cpu", "cuda")), default=None,
              help="Default: GPULANES_DEVICE.")
@click.option("--flower-port", type=click.IntRange(1, 65535), default=5555, show_default=True)
@click.option("--metrics-port", type=click.IntRange(1, 65535), default=9808, show_default=True)
@click.pass_context
def up(ctx: click.Context, workers: int, device: str | None, flower_port: int,
       metrics_port: int) -> None:
    """Run a local cluster until Ctrl-C: Redis, workers, beat, Flower, metrics.

    The cluster `make demo` uses: an embedded Redis under GPULANES_STATE_DIR, one
    worker per device (CPU stand-ins without a GPU) and beat. Flower's login is
    FLOWER_BASIC_AUTH when set (not echoed), else a fresh one printed here.
    """
    from tasks.broker.store import connect
    from tasks.dev.cluster import LocalCluster
    from tasks.ops.metrics import serve
    from tasks.settings import settings

    if not settings.embedded_broker:
        raise click.ClickException("`up` runs its own embedded Redis under "
                                   "GPULANES_STATE_DIR; unset GPULANES_BROKER_URL")
    given = os.environ.get("FLOWER_BASIC_AUTH")
    auth = given or f"admin:{secrets.token_urlsafe(12)}"
    shown = "FLOWER_BASIC_AUTH" if given else auth  # never echo an operator's own secret
    cluster = LocalCluster(settings.state_dir, workers=workers, device=device or settings.device)
    flower = None
    try:
        click.echo(f"starting embedded Redis, {workers} worker(s) and beat ...")
        cluster.start(ctx.obj.app)
        flower = _flower(flower_port, {**cluster.env, "FLOWER_BASIC_AUTH": auth},
                         cluster.log_dir)
        server = serve(connect(cluster.url), metrics_port)
        click.echo(f"broker:  {cluster.url}\nFlower:  http://127.0.0.1:{flower_port}/ "
                   f"(login {shown})\nmetrics: http://127.0.0.1:{server.server_port}/metrics\n"
                   f"logs:    {cluster.log_dir}\nsubmit with GPULANES_BROKER_URL={cluster.url}"
                   "; Ctrl-C stops everything")
        _wait_for_ctrl_c()
    finally:
        if flower is not None:
            flower.terminate()
            try:
                flower.wait(20)
            except subprocess.TimeoutExpired:
                flower.kill()
        cluster.stop()
