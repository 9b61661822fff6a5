"""A prediction's event log and webhook outbox, as the scripts that change a job's state
write them (``lua/events.lua``), on the suite's Redis."""
from __future__ import annotations

import json

from tasks.broker import scripts
from tasks.broker.keys import WEBHOOKS_DUE_KEY, events_key, prediction_key
from tasks.jobs import events


def _state(client, job_id: str, kind: str, state: str) -> None:
    """What Celery's own store of ``state`` does (``lua/result_store.lua``)."""
    scripts.run(client, "result_store", [f"celery-task-meta-{job_id}", prediction_key(job_id)],
                ["{}", 60, kind, json.dumps({"state": state})])


def _progress(client, job_id: str, step: int) -> None:
    scripts.run(client, "progress_store", [f"celery-task-meta-{job_id}",
                                           prediction_key(job_id)],
                [json.dumps({"status": "PROGRESS"}), 60, json.dumps({"step": step})])


def _record(client, job_id: str, hook_kinds: str | None = None, gap_ms: int = 500) -> None:
    client.hset(prediction_key(job_id), mapping={"json": "{}"})
    client.expire(prediction_key(job_id), 100)
    if hook_kinds:
        client.hset(prediction_key(job_id), mapping={
            "hook": WEBHOOKS_DUE_KEY, "hook_kinds": hook_kinds, "hook_gap": gap_ms})


def test_a_job_that_is_no_prediction_logs_nothing_and_its_state_is_stored(clean_redis):
    _state(clean_redis, "plain", "started", "STARTED")
    _progress(clean_redis, "plain", 1)
    assert clean_redis.get("celery-task-meta-plain") is not None
    assert not clean_redis.exists(events_key("plain"))


def test_started_is_logged_once_and_nothing_after_completed(clean_redis):
    _record(clean_redis, "p")
    for _ in range(2):  # a preempted run that resumes begins again
        _state(clean_redis, "p", "started", "STARTED")
    _progress(clean_redis, "p", 3)
    _state(clean_redis, "p", "completed", "SUCCESS")
    _state(clean_redis, "p", "completed", "SUCCESS")  # Celery's store after the run's own
    assert not events.end(clean_redis, "p", "REVOKED", unless_began=False)
    _progress(clean_redis, "p", 4)
    logged = events.after(clean_redis, "p")
    assert [e.kind for e in logged] == ["started", "progress", "output", "completed"]
    assert logged[1].data == {"step": 3} and logged[-1].data == {"state": "SUCCESS"}
    assert [e.id for e in events.after(clean_redis, "p", logged[1].id)] == \
        [e.id for e in logged[2:]]
    assert 0 < clean_redis.ttl(events_key("p")) <= 100


def test_a_cancel_ends_the_log_only_of_a_job_that_never_began(clean_redis):
    _record(clean_redis, "waits")
    _record(clean_redis, "runs")
    _state(clean_redis, "runs", "started", "STARTED")
    assert events.end(clean_redis, "waits", "REVOKED", unless_began=True)
    assert not events.end(clean_redis, "runs", "REVOKED", unless_began=True)
    assert [e.kind for e in events.after(clean_redis, "runs")] == ["started"]


def test_the_outbox_takes_what_the_filter_names_with_progress_spaced(clean_redis):
    _record(clean_redis, "hooked", "started,progress,output,completed", gap_ms=60_000)
    _record(clean_redis, "output-only", "output")
    _state(clean_redis, "hooked", "started", "STARTED")
    for step in (1, 2, 3):  # within one gap: the first only
        _progress(clean_redis, "hooked", step)
    _state(clean_redis, "hooked", "completed", "SUCCESS")
    _state(clean_redis, "output-only", "completed", "SUCCESS")
    due = [member.decode().split(" ") for member in clean_redis.zrange(WEBHOOKS_DUE_KEY, 0, -1)]
    by_job = {}
    for record, event_id, kind in due:
        by_job.setdefault(record[len(prediction_key("")):], []).append(kind)
    assert sorted(by_job["hooked"]) == ["completed", "progress", "started"]
    assert by_job["output-only"] == ["output"]


def test_a_retry_stored_after_its_jobs_end_leaves_the_end(app, clean_redis, monkeypatch):
    """A run that put its job's next copy back in a lane stores RETRY after that, and the
    copy may end meanwhile on another worker. Celery reads for SUCCESS before it writes,
    in a step of its own: a RETRY that read before the end still leaves the end stored."""
    backend = app.backend
    backend.mark_as_retry("again", RuntimeError("this worker's disk"))
    assert backend.get_task_meta("again")["status"] == "RETRY"  # nothing final: stored
    for state, end in (("SUCCESS", lambda j: backend.mark_as_done(j, {"ok": 1})),
                       ("FAILURE", lambda j: backend.mark_as_failure(j, ValueError("bad"))),
                       ("REVOKED", lambda j: backend.mark_as_revoked(j, "cancelled"))):
        job_id = f"ended-{state}"
        end(job_id)
        with monkeypatch.context() as read_before_the_end:
            read_before_the_end.setattr(backend, "_get_task_meta_for",
                                        lambda task_id: {"status": "STARTED"})
            backend.mark_as_retry(job_id, RuntimeError("this worker's disk"))
        assert backend.get_task_meta(job_id)["status"] == state
