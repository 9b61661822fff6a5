"""Raw messages put straight on a lane, as a broken or hostile producer could.

Each is refused without harm: the worker keeps its pid and serves the next job at
once, the message leaves the lane (and kombu's unacked set, so it never comes
back), and it is dead-lettered with a reason that says what was wrong. Pickle is
never deserialized: its payload would create a file, and none appears.
"""
from __future__ import annotations

import base64
import json
import pickle
import uuid
from pathlib import Path

import pytest
from conftest import SMALL, STATE_DIR, wait_until
from kombu.exceptions import ContentDisallowed
from kombu.serialization import loads

from routing.names import JOB_TASK, JOB_TASK_ALIASES, STANDARD, STATS_COMMAND
from tasks import submit
from tasks.broker.handover import push
from tasks.broker.keys import HELD_PREFIX
from tasks.jobs.deadletter import dead_jobs

pytestmark = pytest.mark.cluster

GOOD_JOB = dict(prompt="a lighthouse", tier=STANDARD, account="alice", model="demo", seed=7,
                downgradable=True, **SMALL)
GOOD_ROUTE = {"lane": STANDARD, "requested_tier": STANDARD}
#: Where an unpickled payload would leave its mark.
PWNED = STATE_DIR / "unpickled-here"


class Boom:
    """Unpickling this creates a file at ``path``: proof that a payload was deserialized."""

    def __init__(self, path: Path = PWNED) -> None:
        self.path = path

    def __reduce__(self):
        return (open, (str(self.path), "w"))


@pytest.fixture(scope="module")
def cluster(cluster_factory):
    return cluster_factory(workers=1, beat=False)


def _envelope(body: bytes, content_type: str = "application/json", headers=None,
              lane: str = STANDARD) -> str:
    """A message as kombu's Redis transport stores it in a lane list."""
    return json.dumps({
        "body": base64.b64encode(body).decode(), "content-encoding": "utf-8",
        "content-type": content_type, "headers": headers or {},
        "properties": {"correlation_id": (headers or {}).get("id", "none"),
                       "delivery_mode": 2, "priority": 0, "body_encoding": "base64",
                       "delivery_tag": str(uuid.uuid4()),
                       "delivery_info": {"exchange": lane, "routing_key": lane}}})


def _task(app, kwargs, name: str = JOB_TASK, args=(), drop=()) -> str:
    """A task message as Celery publishes it (protocol 2, JSON), headers in ``drop`` left out."""
    message = app.amqp.as_task_v2(str(uuid.uuid4()), name, args=args, kwargs=kwargs)
    headers = {k: v for k, v in message.headers.items() if k not in drop}
    return _envelope(json.dumps(message.body).encode(), headers=headers)


def _with(raw: str, **fields) -> str:
    """An envelope with some of its top-level fields replaced."""
    return json.dumps({**json.loads(raw), **fields})


def _with_headers(raw: str, **headers) -> str:
    envelope = json.loads(raw)
    return json.dumps({**envelope, "headers": {**envelope["headers"], **headers}})


def _call(**job_changes) -> dict:
    return {"job": {**GOOD_JOB, **job_changes}, "route": GOOD_ROUTE, "submitted_at": 1.0}


def _worker_pid(app) -> int:
    answers = app.control.broadcast(STATS_COMMAND, reply=True, timeout=5, limit=1) or []
    pids = [reply["pid"] for answer in answers for reply in answer.values()]
    assert len(pids) == 1, answers
    return pids[0]


def _pickled(app, with_task_headers: bool) -> str:
    body = pickle.dumps(((), {"job": Boom(), "route": GOOD_ROUTE, "submitted_at": 1.0}, {}))
    headers = json.loads(_task(app, _call()))["headers"] if with_task_headers else {}
    return _envelope(body, "application/x-python-serialize", headers)


#: kind -> (the raw lane item, given the app; what its dead letter's error must say)
KINDS = {
    "malformed_json_body": (lambda app: _envelope(
        b'[[], {"job": {', headers=json.loads(_task(app, _call()))["headers"]), "decode"),
    "unregistered_task": (lambda app: _task(app, {}, name="gpulanes.nope"), "gpulanes.nope"),
    "unregistered_task_without_id": (
        lambda app: _task(app, {}, name="gpulanes.nope", drop=("id",)), "gpulanes.nope"),
    "generate_without_id": (lambda app: _task(app, _call(), drop=("id",)), "id"),
    "missing_kwargs": (lambda app: _task(app, {"job": GOOD_JOB}), "route"),
    "positional_args": (lambda app: _task(app, {}, args=(1, 2, 3)), "keyword arguments only"),
    "route_not_a_dict": (lambda app: _task(app, {**_call(), "route": "fast"}), "route"),
    "missing_job_field": (lambda app: _task(app, _call(steps=None)), "steps"),
    "job_not_a_dict": (lambda app: _task(app, {**_call(), "job": "run me"}), "job"),
    "huge_steps_and_size": (lambda app: _task(app, _call(steps=10**9, width=8192)), "steps"),
    "huge_prompt": (lambda app: _task(app, _call(prompt="x" * 4_000_000)), "prompt"),
    "pickle_task": (lambda app: _pickled(app, True), "pickle"),
    "pickle_without_task_headers": (lambda app: _pickled(app, False), "pickle"),
    "json_without_task_headers": (lambda app: _envelope(b'{"hello": "world"}'), "task"),
    "bad_eta_header": (lambda app: _with_headers(_task(app, _call()), eta="next tuesday"),
                       "eta"),
    "bad_timelimit_header": (lambda app: _with_headers(_task(app, _call()), timelimit=7),
                             "headers"),
    "content_type_not_a_string": (lambda app: _with(_task(app, _call()), **{"content-type": 5}),
                                  "content"),
    "body_not_base64": (lambda app: _with(_task(app, _call()), body="%%% not base64"),
                        "base64"),
    "body_not_text": (lambda app: _with(_task(app, _call()), body=[1, 2]), "not text"),
    "not_json": (lambda app: "this is not json at all {", "not json"),
    "json_not_an_envelope": (lambda app: "[1, 2, 3]", "not a message envelope"),
    "envelope_without_properties": (lambda app: json.dumps({"body": "e30=", "headers": {}}),
                                    "without properties"),
}


def test_a_message_built_here_runs(cluster, app, clean_redis):
    """The builder above makes messages the worker runs, so the refusals below are real.
    Pushed by hand (no wake-up), it is found by the idle worker's periodic take."""
    raw = _task(app, _call())
    clean_redis.lpush(STANDARD, raw)
    out = app.AsyncResult(json.loads(raw)["headers"]["id"]).get(timeout=30)
    assert out["seed"] == GOOD_JOB["seed"] and out["worker"] == cluster.hostnames[0]
    assert dead_jobs(clean_redis) == []


@pytest.mark.parametrize("name", JOB_TASK_ALIASES)
def test_a_job_queued_under_the_tasks_earlier_name_still_runs(name, cluster, app, clean_redis):
    """A message published before the task was renamed runs to its end, as a job."""
    raw = _task(app, _call(), name=name)
    assert json.loads(raw)["headers"]["task"] == name
    push(clean_redis, STANDARD, raw)  # as it was published then: with its wake-up
    out = app.AsyncResult(json.loads(raw)["headers"]["id"]).get(timeout=30)
    assert out["seed"] == GOOD_JOB["seed"] and out["lane"] == STANDARD
    assert out["worker"] == cluster.hostnames[0] and out["attempts"] == 1
    assert dead_jobs(clean_redis) == []


def test_the_pickle_payload_would_leave_its_mark(tmp_path):
    """The proof below is real: unpickling the payload does create its file."""
    pickle.loads(pickle.dumps(Boom(tmp_path / "mark"))).close()
    assert (tmp_path / "mark").exists()


@pytest.mark.parametrize("kind", list(KINDS))
def test_bad_message_is_dead_lettered_and_the_worker_carries_on(kind, cluster, app, clean_redis):
    pid = _worker_pid(app)
    build, says = KINDS[kind]
    push(clean_redis, STANDARD, build(app))  # as a publisher would: with its wake-up
    out = submit("after the bad one", seed=1, **SMALL).get(timeout=30)
    assert out["worker"] == cluster.hostnames[0]
    assert _worker_pid(app) == pid  # the same process: nothing crashed or restarted
    entries = wait_until(lambda: dead_jobs(clean_redis), timeout_s=10, what="a dead letter")
    assert [entry["reason"] for entry in entries] == ["invalid_message"]
    assert says.lower() in entries[0]["error"].lower(), entries[0]["error"]
    assert clean_redis.llen(STANDARD) == 0
    # acked (the good job's ack may trail its result): it never comes back
    wait_until(lambda: not any(clean_redis.hlen(key)
                               for key in clean_redis.keys(HELD_PREFIX + "*")),
               timeout_s=5, what="no record left held")
    assert not PWNED.exists()
    if kind.startswith("pickle"):  # refused and logged, under its id, as pickle
        log = (cluster.log_dir / "workers.log").read_text(errors="replace")
        assert any(entries[0]["job_id"] in line and "type pickle" in line
                   for line in log.splitlines())


def test_only_json_is_accepted(app):
    """JSON in, JSON out: what a worker would load from a pickle message is refused."""
    conf = app.conf
    assert conf.accept_content == conf.result_accept_content == ["json"]
    assert conf.task_serializer == conf.result_serializer == conf.event_serializer == "json"
    with pytest.raises(ContentDisallowed):
        loads(pickle.dumps(Boom()), "application/x-python-serialize", "binary",
              accept=conf.accept_content)
    assert not PWNED.exists()


def test_operators_see_a_refused_message_and_cannot_requeue_it(cluster, app, clean_redis):
    from tests.test_cli import failed, ok

    clean_redis.lpush(STANDARD, _task(app, _call(steps=None)))
    entry = wait_until(lambda: dead_jobs(clean_redis), timeout_s=30, what="a dead letter")[0]
    listed = ok("dead", "list")
    assert entry["job_id"] in listed and "invalid_message" in listed and "steps" in listed
    assert "steps: Input should be a valid integer" in failed("dead", "requeue", entry["job_id"])
    assert [e["job_id"] for e in dead_jobs(clean_redis)] == [entry["job_id"]]  # kept
    assert clean_redis.llen(STANDARD) == 0


def test_a_refused_jobs_letter_is_standard_json():
    """A forged job holding NaN or infinity is kept in its dead letter as text: the
    letter stays standard JSON."""
    from tasks.worker.rejects import _kept

    kept = _kept({"prompt": "p", "seed": float("nan"), "steps": float("-inf"), "n": 1.5})
    assert json.loads(json.dumps(kept, allow_nan=False)) == {
        "prompt": "p", "seed": "nan", "steps": "-inf", "n": 1.5}
