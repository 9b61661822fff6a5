"""``celery -A tasks lanes submit | up | exporter``: run jobs and a cluster from the shell.

Registered on the ``lanes`` group by ``tasks.ops.cli``; heavy imports wait until a
command runs.
"""
from __future__ import annotations

import json
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
from tasks.ops.cli_jobs import follow, made_lines, ran_line
from tasks.ops.group import _client, lanes, plural


def _interrupt(*_: Any) -> None:
    raise KeyboardInterrupt


def _wait_for_ctrl_c() -> None:
    """Block until SIGINT or SIGTERM (both end the command cleanly). SIGINT is handled
    here too: a shell starts a background job with it ignored, and Ctrl-C (or ``kill
    -INT``) must still stop the command."""
    signal.signal(signal.SIGTERM, _interrupt)
    signal.signal(signal.SIGINT, _interrupt)
    try:
        while True:
            time.sleep(3600)
    except KeyboardInterrupt:
        click.echo("\nstopping ...")


# --- submit -------------------------------------------------------------------

def _job_inputs(model: str, prompt: str | None, pairs: tuple[str, ...],
                as_json: str | None, options: dict[str, Any]) -> dict[str, Any]:
    """Every input of the job: ``--input-json``, ``--input`` pairs, the prompt argument
    and the image options given; one input given twice is refused, naming it."""
    from tasks.broker.message import ROUTING
    from tasks.errors import InvalidJob
    from tasks.ops.inputs import parse_inputs

    inputs = parse_inputs(model, pairs, as_json)
    if routing := sorted(set(inputs) & set(ROUTING)):
        raise InvalidJob(routing[0], f"routes the job and is not an input; use --{routing[0]}")
    given = {**({"prompt": prompt} if prompt is not None else {}),
             **{k: v for k, v in options.items() if v is not None}}
    if twice := sorted(set(given) & set(inputs)):
        raise InvalidJob(twice[0], "is given twice (as an option or argument and in --input)")
    return {**inputs, **given}


def _answer(result: Any, out: dict[str, Any] | None) -> dict[str, Any]:
    """``--json``'s answer: the job id and, once it is done, its result."""
    return {"id": result.id, **({"result": out} if out is not None else {})}


@lanes.command("submit")
@click.argument("prompt", required=False)
@click.option("--model", default="demo", show_default=True)
@click.option("--input", "pairs", multiple=True, metavar="KEY=VALUE",
              help="An input of the model (repeat it): VALUE is JSON where the field is not "
                   "text (repeat=2), KEY=@FILE reads it from a file.")
@click.option("--input-json", "input_json", metavar="JSON",
              help="Inputs as one JSON object (or @FILE); --input adds to it.")
@click.option("--tier", type=click.Choice(TIERS), default="standard", show_default=True)
@click.option("--account", default="anonymous", show_default=True)
@click.option("--downgradable/--no-downgradable", default=None,
              help="May it move down a lane under load (default: standard yes, fast no).")
@click.option("--seed", type=int, default=None, help="Same seed, same image (default: drawn).")
@click.option("--steps", type=int, default=None, help="Image models: steps (default 20).")
@click.option("--width", type=int, default=None, help="Image models: width (default 256).")
@click.option("--height", type=int, default=None, help="Image models: height (default 256).")
@click.option("--timeout", "timeout_s", type=click.FloatRange(min=0), default=600.0,
              show_default=True, help="Seconds to wait for the result.")
@click.option("--no-wait", is_flag=True, help="Print only the job id and return at once.")
@click.option("--json", "as_json", is_flag=True,
              help="Print the answer as JSON: the id and, when waited for, the result.")
def submit_command(prompt: str | None, model: str, pairs: tuple[str, ...],
                   input_json: str | None, tier: str, account: str,
                   downgradable: bool | None, timeout_s: float, no_wait: bool, as_json: bool,
                   **options: Any) -> None:
    """Submit one job of MODEL and wait for it: its progress, then what it made.

    An image model (demo) takes PROMPT and --seed/--steps/--width/--height; any model
    takes its inputs as --input KEY=VALUE (or --input-json).

    \b
    For scripts, --no-wait prints only the job id and --json the whole answer:
      id=$(celery -A tasks lanes submit --model echo --input text=hi --no-wait)
    """
    from tasks import submit

    inputs = _job_inputs(model, prompt, pairs, input_json, options)
    result = submit(tier=tier, account=account, model=model, downgradable=downgradable,
                    **inputs)
    if no_wait:
        return click.echo(json.dumps(_answer(result, None)) if as_json else result.id)
    if not as_json:
        click.echo(f"job {result.id} submitted ({tier})")
    out = follow(result, timeout_s, sys.stdout.isatty() and not as_json, err=as_json)
    if as_json:
        return click.echo(json.dumps(_answer(result, out), indent=2))
    click.echo("\n".join([*made_lines(out), f"ran {ran_line(out)}"]))


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
    click.echo(f"gpulanes metrics on http://{address}:{server.server_port}/metrics, "
               f"scaling on /scaling", err=True)
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


def _check_before_start() -> None:
    """What would stop the cluster, found before anything starts: the settings (a bad
    one raises ``ConfigError`` naming its variable), a broker of its own, every
    model's class, imported as each worker imports them first, and the warm models'
    declared sizes against the CPU budget."""
    from tasks.jobs import catalog
    from tasks.settings import settings

    if not settings.embedded_broker:
        raise click.ClickException("`up` runs its own embedded Redis under "
                                   "GPULANES_STATE_DIR; unset GPULANES_BROKER_URL")
    for name in settings.models:  # ModelError: its module or class cannot be imported
        catalog.spec(name)
    if settings.device != "cuda":  # the warm models' declared sizes, on the CPU budget
        from gpu_worker.memory import check_warm

        check_warm({name: catalog.spec(name).memory_mb for name in settings.warm_models},
                   settings.model_memory_mb,
                   f"GPULANES_MODEL_MEMORY_MB={settings.model_memory_mb}")


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

    _check_before_start()
    given = os.environ.get("FLOWER_BASIC_AUTH")
    auth = given or f"admin:{secrets.token_urlsafe(12)}"
    shown = "FLOWER_BASIC_AUTH" if given else auth  # never echo an operator's own secret
    cluster = LocalCluster(settings.state_dir, workers=workers, device=device or settings.device)
    flower = None
    try:
        click.echo(f"starting embedded Redis, {plural(workers, 'worker')} and beat ...")
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
