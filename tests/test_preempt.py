"""A running job's lifecycle on real workers: its progress, cancelling it mid-run, and a
fast job that preempts it at a step boundary (resumed bit for bit, or run again from
the start after its worker died).

Jobs of the real ``demo`` model, long enough (768 px: about 30 ms a step on one CPU
thread) that a test acts while they run; every wait is on a job's reported state.
"""
from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest
from conftest import vary, wait_until

from tasks import submit
from tasks.broker.keys import METRICS_KEY, metric_field
from tasks.jobs.accounts import fast_seconds_left
from tests.harness.faults import worker_pids

pytestmark = pytest.mark.cluster
LONG = dict(steps=120, width=768, height=768)
#: Long enough for a CLI to start while it runs (about 8 s).
HUGE = dict(steps=150, width=1024, height=1024)
QUICK = dict(steps=10, width=256, height=256)
#: 150 steps of 50 ms, that wait as on a GPU: long, and no load on the shared cores.
PACED = dict(model="paced", steps=150, step_ms=50)
PROJECT_DIR = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def cluster(cluster_factory):
    # jobs repeat their seeds to compare images: the result cache would answer them
    return cluster_factory(workers=2, beat=True, env={"GPULANES_CACHE": "false",
                                                      "GPULANES_MAX_PREEMPTIONS": "1"})


@pytest.fixture(autouse=True)
def settings_here(monkeypatch):
    vary(monkeypatch, cache=False, max_preemptions=1)


def progress(result) -> dict | None:
    """``result``'s progress info, None unless it reports progress: state and info in
    one read (read apart, the info may be a newer run's STARTED)."""
    meta = result.backend.get_task_meta(result.id)
    return meta.get("result") if meta.get("status") == "PROGRESS" else None


def reported(result, predicate, what: str, timeout_s: float = 60.0) -> dict:
    """Wait until ``result``'s progress info satisfies ``predicate``; that info."""
    def found():
        info = progress(result)
        return info if info is not None and predicate(info) else None
    return wait_until(found, timeout_s, f"job {result.id}: {what}")


def at_step(result, step: int) -> dict:
    return reported(result, lambda info: not info.get("paused") and info.get("step", 0) >= step,
                    f"running at step {step}")


def paused(results: list) -> object:
    """The one of ``results`` that stepped aside and waits to resume."""
    return wait_until(lambda: next((r for r in results if (progress(r) or {}).get("paused")),
                                   None), 60, "a preempted job")


def _log(cluster) -> str:
    return (cluster.log_dir / "workers.log").read_text(errors="replace")


def lanes(*args: str) -> str:
    return lanes_at_once(args)[0]


def lanes_at_once(*calls: tuple[str, ...]) -> list[str]:
    """What each ``celery -A tasks lanes`` call printed, the calls started together: their
    answers tell of one moment, not of several, however long each takes to start."""
    procs = [subprocess.Popen([sys.executable, "-m", "celery", "-A", "tasks", "lanes", *args],
                              cwd=PROJECT_DIR, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              text=True) for args in calls]
    printed = []
    for proc in procs:
        out, err = proc.communicate(timeout=60)
        assert proc.returncode == 0, err
        printed.append(out)
    return printed


def test_progress_is_seen_while_a_job_runs_and_lanes_job_shows_it(cluster):
    first, second = (submit(f"progress {i}", tier="relaxed", seed=i, **HUGE) for i in (1, 2))
    info = at_step(first, 2)
    assert info["steps"] == 150 and info["lane"] == "relaxed" and info["preempted"] == 0
    assert info["worker"] in cluster.hostnames and info["eta_s"] > 0
    assert at_step(first, info["step"] + 5)["step"] > info["step"]  # it moves on
    at_step(second, 1)
    queued = submit("progress queued", tier="relaxed", seed=3, **QUICK)  # both workers busy
    waiting, running = lanes_at_once(("job", queued.id), ("job", first.id))
    # queued: in the shared lane or its model's worker's queue
    assert "queued in the relaxed lane" in waiting and ", 0 jobs ahead" in waiting
    assert "running in the relaxed lane on gpu" in running
    for result in (first, second, queued):
        assert result.get(timeout=120)["lane"] == "relaxed"
    assert "done in the relaxed lane" in lanes("job", first.id)


def test_a_running_fast_job_revoked_stops_at_a_step_charged_what_it_ran(cluster):
    account = "canceller"
    before = fast_seconds_left(account)
    job = submit(tier="fast", account=account, n=11, **PACED)
    info = at_step(job, 5)
    revoked_at = time.monotonic()
    job.revoke()
    wait_until(lambda: job.state == "REVOKED", 30, "the revoked job to stop")
    stopped_s = time.monotonic() - revoked_at
    step_s = info["running_s"] / info["step"]
    assert stopped_s < (150 - info["step"]) * step_s / 2  # far from its end
    charged = before - fast_seconds_left(account)
    assert 0 < charged < 150 * step_s  # the seconds it ran: not nothing, not a whole job
    assert submit("after the cancel", tier="fast", seed=12, **QUICK).get(timeout=60)["image"]
    other = submit(tier="relaxed", n=13, **PACED)
    at_step(other, 2)
    assert "cancelled" in lanes("cancel", other.id)  # the CLI way
    wait_until(lambda: other.state == "REVOKED", 30, "the job cancelled from the CLI")


def test_a_fast_job_preempts_a_relaxed_one_which_resumes_bit_for_bit(cluster, clean_redis):
    alone = {seed: submit("resume me", tier="relaxed", seed=seed, **LONG).get(timeout=120)
             for seed in (21, 22)}
    assert {out["preempted"] for out in alone.values()} == {0}
    victims = {seed: submit("resume me", tier="relaxed", seed=seed, **LONG) for seed in alone}
    for victim in victims.values():  # both workers busy with relaxed work
        at_step(victim, 10)
    fast = submit("urgent", tier="fast", seed=23, **QUICK).get(timeout=60)
    outs = {seed: victim.get(timeout=120) for seed, victim in victims.items()}
    assert sorted(out["preempted"] for out in outs.values()) == [0, 1]  # one stepped aside
    for seed, out in outs.items():
        assert out["sha256"] == alone[seed]["sha256"]  # the same image, preempted or not
    resumed = next(out for out in outs.values() if out["preempted"])
    assert resumed["worker"] == fast["worker"]  # it waited on its worker, state and all
    assert resumed["attempts"] == 2  # two runs: the second took up where the first stopped
    assert f"job {resumed['job_id']} resumes at step " in _log(cluster)
    step_s = alone[21]["run_ms"] / 1000 / LONG["steps"]
    assert fast["queued_ms"] / 1000 < 40 * step_s  # a few steps, never a relaxed job
    assert int(clean_redis.hget(METRICS_KEY, metric_field("preemptions", "relaxed"))) == 1


def test_a_worker_told_to_stop_hands_its_job_on_to_resume_where_it_was(cluster, app):
    """SIGTERM (a scale-down) to the worker running a job: the run steps aside at its next
    step, its state through the artifact store, and the other worker, idle, resumes it
    there: no step runs twice, and the image is the one an uninterrupted run makes. The
    stopped worker exits within a few step times (its supervisor then starts it anew)."""
    alone = submit("hand me on", tier="relaxed", seed=31, **LONG).get(timeout=120)
    job = submit("hand me on", tier="relaxed", seed=31, **LONG)
    info = at_step(job, 10)
    pid = worker_pids(app, 2)[info["worker"]]
    os.kill(pid, signal.SIGTERM)
    out = job.get(timeout=120)
    assert out["sha256"] == alone["sha256"]  # the same image, handed on or not
    assert out["worker"] != info["worker"] and out["preempted"] == 1
    assert out["attempts"] == 2  # (its steps not run again: the log's resume step, below)
    log = _log(cluster)
    assert f"job {job.id} stepped aside at step " in log and "this worker is stopping" in log
    resumed_at = int(re.search(rf"job {job.id} resumes at step (\d+)", log).group(1))
    assert resumed_at >= info["step"]  # the steps run before the stop are not run again
    step_s = alone["run_ms"] / 1000 / LONG["steps"]
    wait_until(lambda: not psutil.pid_exists(pid) or psutil.Process(pid).status() == "zombie",
               30 + 2 * step_s, "the stopped worker to exit")
    assert len(worker_pids(app, 2)) == 2  # started anew by its supervisor, for what follows


def test_a_relaxed_run_steps_aside_for_a_first_level_standard_job_and_resumes(
        cluster, clean_redis):
    """A light account's standard job waits a few steps, not a relaxed job's run: one of
    the relaxed runs steps aside for it, its copy at its own level in its worker's own
    queue, and picks up where it stopped once the standard job is done."""
    victims = [submit("make way", tier="relaxed", seed=seed, **LONG) for seed in (71, 72)]
    for victim in victims:  # both workers busy with relaxed work
        at_step(victim, 10)
    light = submit("a light account's", tier="standard", account="newcomer", seed=73,
                   **QUICK).get(timeout=60)
    outs = [victim.get(timeout=120) for victim in victims]
    assert light["lane"] == "standard" and light["preempted"] == 0
    assert sorted(out["preempted"] for out in outs) == [0, 1]  # one stepped aside
    resumed = next(out for out in outs if out["preempted"])
    assert resumed["worker"] == light["worker"] and resumed["attempts"] == 2
    assert f"job {resumed['job_id']} resumes at step " in _log(cluster)
    step_s = min(out["run_ms"] for out in outs) / 1000 / LONG["steps"]
    assert light["queued_ms"] / 1000 < 40 * step_s  # a few steps, never a relaxed job
    assert int(clean_redis.hget(METRICS_KEY, metric_field("preemptions", "relaxed"))) == 1


def test_a_job_is_preempted_at_most_the_set_times(cluster):
    """GPULANES_MAX_PREEMPTIONS=1: once both relaxed jobs stepped aside, a third fast job
    waits for one to end."""
    # long enough that the second victim still has more than a tenth of the fast budget
    # to run when the second fast job comes (a run about to end finishes first)
    victims = [submit(f"capped {i}", tier="relaxed", seed=30 + i, **HUGE)
               for i in range(2)]
    for victim in victims:
        at_step(victim, 5)
    fasts = [submit("first fast", tier="fast", seed=33, **QUICK).get(timeout=60)]
    # the one that stepped aside (once resumed, its run reports STARTED before its steps)
    first = wait_until(lambda: next((v for v in victims if (progress(v) or {}).get("preempted")),
                                    None), 60, "a preempted job")
    reported(first, lambda info: info["preempted"] == 1 and not info.get("paused"), "resumed")
    fasts.append(submit("second fast", tier="fast", seed=34, **QUICK).get(timeout=60))
    other = next(v for v in victims if v is not first)
    reported(other, lambda info: info["preempted"] == 1 and not info.get("paused"), "resumed")
    third = submit("third fast", tier="fast", seed=35, **QUICK).get(timeout=120)
    outs = [v.get(timeout=120) for v in victims]
    assert [out["preempted"] for out in outs] == [1, 1]
    assert all(f["queued_ms"] < third["queued_ms"] for f in fasts)
    assert third["started_at"] >= min(out["started_at"] + out["run_ms"] / 1000 for out in outs) - 0.5


def test_a_preempted_job_cancelled_while_it_waits_never_resumes(cluster):
    victims = [submit(f"doomed {i}", tier="relaxed", seed=40 + i, **LONG) for i in range(2)]
    for victim in victims:
        at_step(victim, 5)
    blocker = submit("long fast", tier="fast", seed=42, **LONG)  # runs while one waits
    waiting = paused(victims)
    waiting.revoke()
    wait_until(lambda: waiting.state == "REVOKED", 60, "the waiting job revoked")
    assert blocker.get(timeout=120)["preempted"] == 0  # a fast job is never preempted
    (other,) = [v for v in victims if v is not waiting]
    assert other.get(timeout=120)["lane"] == "relaxed"
    assert f"job {waiting.id} resumes at step" not in _log(cluster)  # it never ran again


def test_a_worker_killed_holding_a_preempted_job_loses_nothing(cluster, app):
    reference = {seed: submit("survivor", tier="relaxed", seed=seed, **LONG).get(timeout=120)
                 for seed in (51, 52)}
    victims = {seed: submit("survivor", tier="relaxed", seed=seed, **LONG) for seed in reference}
    for victim in victims.values():
        at_step(victim, 5)
    blocker = submit("long fast", tier="fast", seed=53, **LONG)
    waiting = paused(list(victims.values()))
    holder = waiting.info["worker"]
    at_step(blocker, 2)
    os.kill(worker_pids(app, 2)[holder], signal.SIGKILL)  # with it, the state it kept
    outs = {seed: victim.get(timeout=180) for seed, victim in victims.items()}
    for seed, out in outs.items():  # every job done, the preempted one run again whole
        assert out["sha256"] == reference[seed]["sha256"]
    assert sorted(out["preempted"] for out in outs.values()) == [0, 1]
    assert f"job {waiting.id} resumes at step" not in _log(cluster)  # its state died too
    assert blocker.get(timeout=180)["image"]


def test_lanes_submit_draws_the_jobs_progress_from_its_steps(cluster):
    out = lanes("submit", "a bar of progress", "--seed", "61", "--steps", "60", "--width",
                "768", "--height", "768")
    steps = [line for line in out.splitlines() if line.startswith("running [")]
    assert steps and all("/60" in line for line in steps), out  # "running [###...] step 7/60"
    # the result's line (the lane is the policy's: a busy standard lane moves it down)
    assert out.splitlines()[-1].startswith("ran in the "), out
