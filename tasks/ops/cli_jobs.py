"""``celery -A tasks lanes job ID`` and ``lanes cancel ID...``: one job's state, and
stopping jobs; the progress a job shows while a command waits for it.

Registered on the ``lanes`` group by ``tasks.ops.cli``.
"""
from __future__ import annotations

import time
from typing import Any

import click

from tasks.ops.group import _client, _echo_json, duration, lanes

#: Celery's states as a person reads them.
STATES = {"PENDING": "queued", "RECEIVED": "queued", "STARTED": "running",
          "PROGRESS": "running", "RETRY": "retrying"}
BAR_WIDTH = 24


def bar(step: int, steps: int | None) -> str:
    """``[#########...............]  37%`` (just the step count when steps are unknown)."""
    if not steps:
        return f"step {step}"
    filled = min(BAR_WIDTH, BAR_WIDTH * step // steps)
    return f"[{'#' * filled}{'.' * (BAR_WIDTH - filled)}] {100 * step // steps:3d}%"


def running_line(info: dict[str, Any]) -> str:
    """A running job's bar and progress: ``[####....]  40% step 8/20, eta 1.2 s, ...``."""
    from tasks.worker.progress import line

    return f"{bar(info.get('step', 0), info.get('steps'))} {line(info)}"


def follow(result: Any, timeout_s: float, tty: bool) -> dict:
    """Wait for ``result``: on a terminal a live line (state, progress bar, elapsed
    time), else a line per state and per step it reports; its result dict."""
    began, shown = time.monotonic(), None
    while True:
        done = result.ready()
        state = "done" if done else STATES.get(result.state, result.state.lower())
        info = result.info if result.state == "PROGRESS" else None
        if not isinstance(info, dict) or "step" not in info:
            info = None  # read apart from its state: a run that began anew says STARTED
        if info and info.get("paused"):
            state = "preempted"
        text = f"{state} {running_line(info)}" if info else state
        if tty:
            click.echo(f"\r{text:<60} {time.monotonic() - began:6.1f}s", nl=done)
        elif text != shown:  # every state and step it passes through
            click.echo(f"{text} ..." if not done else "done")
        shown = text
        if done:
            return result.get(timeout=1)
        if time.monotonic() - began > timeout_s:
            raise click.ClickException(f"job {result.id} not done after {timeout_s:g}s; "
                                       "it stays queued: check `celery -A tasks lanes status`")
        time.sleep(0.1)


def describe(app: Any, client: Any, job_id: str) -> dict[str, Any]:
    """A job's state: its result, its progress, or where it waits."""
    from tasks.broker.keys import lease_key
    from tasks.broker.publish import RELEASED
    from tasks.broker.queued import place

    result = app.AsyncResult(job_id)
    state, info = result.state, result.info
    found: dict[str, Any] = {"id": job_id, "state": state}
    if state == "SUCCESS" and isinstance(info, dict):
        found["result"] = info
    elif state == "PROGRESS" and isinstance(info, dict):
        found["progress"] = info
    elif state in ("FAILURE", "REVOKED", "RETRY"):
        found["error"] = f"{type(info).__name__}: {info}" if info else state.lower()
    elif (waiting := place(client, job_id)) is not None:
        found.update(state="QUEUED", **waiting)
    elif (lease := client.get(lease_key(job_id))) and not lease.startswith(RELEASED):
        found["state"] = "STARTED"  # taken, no step reported yet
    return found


def _text(found: dict[str, Any]) -> str:
    job, state = f"job {found['id']}", found["state"]
    if state == "QUEUED":
        where = f" ({found['queue']})" if found["queue"] != found["lane"] else ""
        return f"{job}: queued in the {found['lane']} lane{where}, {found['ahead']} jobs ahead"
    if state == "PROGRESS":
        info = found["progress"]
        doing = "waits to resume" if info.get("paused") else "running"
        preempted = f", preempted {info['preempted']}x" if info.get("preempted") else ""
        return (f"{job}: {doing} in the {info['lane']} lane on {info['worker']}: "
                f"{running_line(info)}{preempted}")
    if state == "RETRY":
        return f"{job}: failed a try, retrying ({found.get('error', 'retry')})"
    if state == "SUCCESS":
        out = found["result"]
        notes = [f"preempted {out['preempted']}x" if out.get("preempted") else "",
                 "from the cache" if out.get("cached") else ""]
        extra = "".join(f", {note}" for note in notes if note)
        return (f"{job}: done in the {out['lane']} lane on {out.get('worker') or '-'}; "
                f"waited {duration(out['queued_ms'] / 1000)}, ran "
                f"{duration(out['run_ms'] / 1000)}{extra}")
    if state in ("FAILURE", "REVOKED"):
        return f"{job}: {state.lower()}: {found['error']}"
    if state == "STARTED":
        return f"{job}: running (no step reported yet)"
    return f"{job}: unknown here (never submitted, not yet published, or its result expired)"


@lanes.command("job")
@click.argument("job_id")
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
@click.pass_context
def job(ctx: click.Context, job_id: str, as_json: bool) -> None:
    """A job's state: queued (its lane, the jobs ahead), running (its step), or done."""
    found = describe(ctx.obj.app, _client(ctx), job_id)
    if as_json:
        _echo_json(found)
    else:
        click.echo(_text(found))


@lanes.command("cancel")
@click.argument("job_ids", nargs=-1, required=True)
@click.pass_context
def cancel(ctx: click.Context, job_ids: tuple[str, ...]) -> None:
    """Cancel jobs: a queued one never runs, a running one stops at its next step."""
    ctx.obj.app.control.revoke(list(job_ids))
    for job_id in job_ids:
        click.echo(f"job {job_id}: cancelled (a running job stops at its next step)")
