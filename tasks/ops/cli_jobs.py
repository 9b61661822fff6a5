"""``celery -A tasks lanes job ID`` and ``lanes cancel ID...``: one job's state, what a
finished one made, and stopping jobs; the progress a job shows while a command waits.

Registered on the ``lanes`` group by ``tasks.ops.cli``. A job's state comes from its
result, else from the broker's records of accepted jobs (``tasks.ops.records``).
"""
from __future__ import annotations

import json
import time
from typing import Any, Iterator

import click
import redis

from tasks.ops.group import _client, _echo_json, duration, lanes, plural
from tasks.ops.records import describe

#: Celery's states as a person reads them.
STATES = {"PENDING": "queued", "RECEIVED": "queued", "STARTED": "running",
          "PROGRESS": "running", "RETRY": "retrying"}
BAR_WIDTH = 24
#: The fields of an artifact reference in a result's ``output`` (``tasks.jobs.artifacts``).
ARTIFACT_FIELDS = frozenset({"url", "media_type", "bytes", "sha256"})


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


def follow(result: Any, timeout_s: float, tty: bool, err: bool = False) -> dict:
    """Wait for ``result``: on a terminal a live line (state, progress bar, elapsed
    time), else a line per state and per step it reports (on stderr with ``err``); its
    result dict. A failed job is a one-line :class:`click.ClickException`."""
    began, shown = time.monotonic(), None
    while True:
        done = result.ready()
        text = "done" if done else _progress_text(result)
        if tty:
            click.echo(f"\r{text:<60} {time.monotonic() - began:6.1f}s", nl=done, err=err)
        elif text != shown:  # every state and step it passes through
            click.echo(f"{text} ..." if not done else "done", err=err)
        shown = text
        if done:
            return _outcome(result)
        if time.monotonic() - began > timeout_s:
            raise click.ClickException(f"job {result.id} not done after {timeout_s:g}s; "
                                       "it stays queued: check `celery -A tasks lanes status`")
        time.sleep(0.1)


def _progress_text(result: Any) -> str:
    state = STATES.get(result.state, result.state.lower())
    info = result.info if result.state == "PROGRESS" else None
    if not isinstance(info, dict) or "step" not in info:
        return state  # read apart from its state: a run that began anew says STARTED
    return f"{'preempted' if info.get('paused') else state} {running_line(info)}"


def _outcome(result: Any) -> dict:
    from tasks.errors import GpulanesError

    try:
        return result.get(timeout=1)
    except GpulanesError:
        raise  # the group says it in one line
    except Exception as exc:  # noqa: BLE001  the job's own failure, as a line
        raise click.ClickException(f"job {result.id} failed: {type(exc).__name__}: "
                                   f"{exc}") from exc


def made_lines(out: dict[str, Any]) -> list[str]:
    """What a finished job made, for people: an image model's ``image: PATH (... bytes,
    sha256 ...)``, else a line ``output.KEY: VALUE`` per value of its output, each
    artifact as its URL, media type, size and sha256."""
    if "image" in out:
        return [f"image: {out['image']}{_about(out)}"]
    return [f"output{path}: {text}" for path, text in _leaves(out.get("output"), "")]


def _leaves(value: Any, path: str) -> Iterator[tuple[str, str]]:
    if isinstance(value, dict) and ARTIFACT_FIELDS <= set(value):
        yield path, f"{value['url']}{_about(value)}"
    elif isinstance(value, dict) and value:
        for key, item in value.items():
            yield from _leaves(item, f"{path}.{key}")
    elif isinstance(value, list) and value:
        for index, item in enumerate(value):
            yield from _leaves(item, f"{path}[{index}]")
    elif isinstance(value, str) and "\n" not in value:
        yield path, value
    else:
        yield path, json.dumps(value)


def _about(ref: dict[str, Any]) -> str:
    """`` (image/png, 2048 bytes, sha256 9f86...)``: what a reference says of its file."""
    parts = [ref.get("media_type"), ref.get("bytes") is not None and plural(ref["bytes"], "byte"),
             ref.get("sha256") and f"sha256 {ref['sha256']}"]
    shown = [part for part in parts if part]
    return f" ({', '.join(shown)})" if shown else ""


def ran_line(out: dict[str, Any]) -> str:
    """Where and how long a finished job ran: ``done in the fast lane on gpu0@host;
    waited 12ms, ran 1.4s``, and whether it was moved down, preempted, or cached."""
    notes = [f"moved down from {out['downgraded_from']} ({out.get('downgrade_reason', '-')})"
             if out.get("downgraded_from") else "",
             f"preempted {out['preempted']}x" if out.get("preempted") else "",
             "from the cache" if out.get("cached") else ""]
    extra = "".join(f", {note}" for note in notes if note)
    return (f"in the {out['lane']} lane on {out.get('worker') or '-'}; waited "
            f"{duration(out['queued_ms'] / 1000)}, ran {duration(out['run_ms'] / 1000)}{extra}")


def _text(found: dict[str, Any]) -> str:
    job, state = f"job {found['id']}", found["state"]
    if state == "QUEUED":
        where = f" ({found['queue']})" if found["queue"] != found["lane"] else ""
        return (f"{job}: queued in the {found['lane']} lane{where}, "
                f"{plural(found['ahead'], 'job')} ahead")
    if state == "PROGRESS":
        info = found["progress"]
        doing = "waits to resume" if info.get("paused") else "running"
        preempted = f", preempted {info['preempted']}x" if info.get("preempted") else ""
        return (f"{job}: {doing} in the {info['lane']} lane on {info['worker']}: "
                f"{running_line(info)}{preempted}")
    if state == "SUCCESS":
        out = found["result"]
        return "\n".join([f"{job}: done {ran_line(out)}", *made_lines(out)])
    return f"{job}: {_other_text(found)}"


def _other_text(found: dict[str, Any]) -> str:
    """What ``lanes job`` says of a job neither queued, running with steps, nor done."""
    state = found["state"]
    if state in ("FAILURE", "REVOKED"):
        return f"{state.lower()}: {found['error']}"
    return {"RETRY": f"failed a try, retrying ({found.get('error', 'retry')})",
            "STARTED": "running (no step reported yet)",
            "TAKEN": "taken by a worker (about to run, or waiting out a retry's delay)",
            "FOLLOWING": f"shares the run of job {found.get('leader')} (the same inputs); "
                         "its result is written when that run ends",
            "ACCEPTED": "accepted, between runs (a retry on its way, or its worker lost)",
            }.get(state, "unknown here (never submitted, or its records expired: results "
                         "are kept GPULANES_RESULT_TTL_S)")


def _cell_of(ctx: click.Context, job_id: str) -> tuple[Any, redis.Redis]:
    """The Celery app and Redis client of the cell ``job_id`` names (``tasks.broker.
    cells``); with one Redis, or an id of none, the CLI's own."""
    from tasks.broker.cell import named_by
    from tasks.broker.cells import of_job

    if named_by(job_id) is None:
        return ctx.obj.app, _client(ctx)
    return of_job(job_id)


@lanes.command("job")
@click.argument("job_id")
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
@click.pass_context
def job(ctx: click.Context, job_id: str, as_json: bool) -> None:
    """A job's state: queued (its lane, the jobs ahead), running (its step), or done
    (where it ran, and what it made: an image's path, or its output with artifact URLs)."""
    found = describe(*_cell_of(ctx, job_id), job_id)
    if as_json:
        _echo_json(found)
    else:
        click.echo(_text(found))


#: States of a job that a cancel leaves alone: it ran to its end, or was cancelled.
SETTLED = {"SUCCESS": "already finished; nothing to cancel",
           "FAILURE": "already finished (failed); nothing to cancel",
           "REVOKED": "already cancelled"}


def _cancelled_line(found: dict[str, Any]) -> str:
    """What ``lanes cancel`` did to a job it knows."""
    state, job = found["state"], f"job {found['id']}"
    if state in SETTLED:
        return f"{job}: {SETTLED[state]}"
    if state == "QUEUED":
        return f"{job}: cancelled while queued in the {found['lane']} lane; it will not run"
    if state == "TAKEN":
        return f"{job}: cancelled as a worker took it; it does not run on"
    if state in ("PROGRESS", "STARTED"):
        worker = (found.get("progress") or {}).get("worker")
        return f"{job}: cancelled while running{f' on {worker}' if worker else ''}; " \
               "it stops at its next step"
    if state == "FOLLOWING":
        return f"{job}: cancelled; it gets no result (the run of job {found['leader']} goes on)"
    return f"{job}: cancelled; it will not run again"


@lanes.command("cancel")
@click.argument("job_ids", nargs=-1, required=True)
@click.pass_context
def cancel(ctx: click.Context, job_ids: tuple[str, ...]) -> None:
    """Cancel jobs: a queued one never runs, a running one stops at its next step.

    A job that already finished, or was cancelled, is left as it is and says so (exit
    status 0). An id with no record (never submitted, or its records expired) is an
    error: exit status 1 when any id is unknown; the others are cancelled all the same.
    """
    found = [describe(*_cell_of(ctx, job_id), job_id) for job_id in dict.fromkeys(job_ids)]
    live: dict[Any, list[str]] = {}  # per cell's app
    for each in found:
        if each["state"] not in SETTLED and each["state"] != "PENDING":
            live.setdefault(_cell_of(ctx, each["id"])[0], []).append(each["id"])
    for app, ids in live.items():
        app.control.revoke(ids)
    for each in found:
        if each["state"] == "PENDING":
            click.echo(f"Error: no job {each['id']}: never submitted, or its records "
                       "expired (results are kept GPULANES_RESULT_TTL_S)", err=True)
        else:
            click.echo(_cancelled_line(each))
    if any(each["state"] == "PENDING" for each in found):
        ctx.exit(1)
