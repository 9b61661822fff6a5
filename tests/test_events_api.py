"""A prediction's events over HTTP (Server-Sent Events): a real worker, ``celery -A tasks
lanes api`` in its own processes, httpx reading the stream."""
from __future__ import annotations

import threading
import uuid

import httpx
import pytest
from conftest import SMALL, STATE_DIR, wait_until

from tasks.jobs import apikeys, events
from tests.flaky_model import at_gate, open_gate
from tests.harness import sse
from tests.harness.http import ApiServer

pytestmark = pytest.mark.cluster
#: A job of 8 steps of 150 ms at least: it reports its progress a few times.
PACED = {"prompt": "pace:150 a slow fox", "steps": 8, "width": 64, "height": 64}
LOGS = STATE_DIR / "logs" / "test_events_api"


@pytest.fixture(scope="module")
def worker(cluster_factory):
    return cluster_factory(workers=1)


@pytest.fixture(scope="module")
def api(redis_server):
    with ApiServer(LOGS) as server:
        yield server


@pytest.fixture
def owner(key):
    return key()


def create(http: httpx.Client, auth: dict, model: str = "flaky", **body) -> dict:
    made = http.post("/v1/predictions", json={"model": model, **body}, headers=auth)
    assert made.status_code == 201, made.text
    return made.json()


def kinds(events: list[dict]) -> list[str]:
    return [event["event"] for event in events]


def test_a_prediction_streams_its_start_progress_output_and_end_then_the_stream_ends(
        http, owner, worker):
    made = create(http, owner, input=PACED)
    assert made["urls"]["stream"] == f"{made['urls']['get']}/events"
    got = sse.read(http, made["urls"]["stream"], owner)
    assert kinds(got)[:2] == ["queued", "started"] and kinds(got)[-2:] == ["output", "completed"]
    assert set(kinds(got)[2:-2]) == {"progress"} and len(got) >= 5, kinds(got)
    ids = [event["id"] for event in got]
    assert len(set(ids)) == len(ids) and ids == sorted(ids, key=lambda i: tuple(
        map(int, i.split("-")))), "each event has its own id, in order"
    assert got[0]["data"]["queue"]["lane"] == "standard"
    steps = [event["data"]["progress"]["step"] for event in got[2:-2]]
    assert steps == sorted(steps) and all(0 < s < 8 for s in steps)
    assert got[2]["data"]["progress"]["steps"] == 8
    final = http.get(made["urls"]["get"], headers=owner).json()
    assert got[-1]["data"] == final and final["status"] == "succeeded"
    assert got[-2]["data"]["output"] == final["output"]
    image = http.get(final["output"]["image"]["url"], headers=owner)
    assert image.content.startswith(b"\x89PNG")
    failed = create(http, owner, input={"prompt": "bug", **SMALL})
    got = sse.read(http, failed["urls"]["stream"], owner)
    assert kinds(got) == ["queued", "started", "completed"]
    assert got[-1]["data"]["status"] == "failed" and "simulated bug" in got[-1]["data"]["error"]


def test_a_reader_that_reconnects_gets_each_later_event_once_across_an_api_restart(
        http, owner, worker):
    made = create(http, owner, input=PACED)
    path = f"/v1/predictions/{made['id']}/events"
    whole = sse.read(http, path, owner)
    ids = [event["id"] for event in whole]
    for cut in range(1, len(whole)):  # from after each event: the rest, each once
        rest = sse.read(http, path, owner, last_id=ids[cut - 1])
        assert [event["id"] for event in rest] == ids[cut:]
    second = create(http, owner, input=PACED)
    path = f"/v1/predictions/{second['id']}/events"
    with ApiServer(LOGS, name="restarted") as first_api:
        with httpx.Client(base_url=first_api.url) as client:
            begun = sse.read(client, path, owner, stop=2)  # queued, started
    with ApiServer(LOGS, name="restarted") as again:  # a new process, a new port
        with httpx.Client(base_url=again.url) as client:
            rest = sse.read(client, path, owner, last_id=begun[-1]["id"])
            whole = sse.read(client, path, owner)
    assert [e["id"] for e in begun + rest] == [e["id"] for e in whole]
    assert kinds(begun + rest)[-1] == "completed"


def test_a_cancel_while_queued_ends_the_stream_at_once_and_only_once(http, owner, worker,
                                                                    clean_redis):
    gate = uuid.uuid4().hex[:12]
    holder = create(http, owner, input={"prompt": f"gate:{gate}", **SMALL})
    try:
        wait_until(lambda: at_gate(gate), 30, what="the held job to reach its gate")
        waiting = create(http, owner, model="echo", input={"text": "hi"})
        behind = create(http, owner, model="echo", input={"text": "ho"})
        first = sse.read(http, behind["urls"]["stream"], owner, stop=1)[0]
        assert first["event"] == "queued" and first["data"]["queue"]["position"] == 1
        http.post(waiting["urls"]["cancel"], headers=owner).raise_for_status()
        got = sse.read(http, waiting["urls"]["stream"], owner)
        assert kinds(got) == ["queued", "completed"]
        assert got[-1]["data"]["status"] == "canceled"
    finally:
        open_gate(gate)
    sse.read(http, holder["urls"]["stream"], owner)  # the worker moved past the canceled
    sse.read(http, behind["urls"]["stream"], owner)
    logged = [event.kind for event in events.after(clean_redis, waiting["id"])]
    assert logged == ["queued", "completed"], "the worker's REVOKED is not a 2nd end"


def test_a_stream_needs_the_owners_key_and_a_valid_last_event_id(http, owner, worker,
                                                                  clean_redis):
    made = create(http, owner, model="echo", input={"text": "hi"})
    path = made["urls"]["stream"]
    assert http.get(path).status_code == 401
    other, _ = apikeys.create(clean_redis, "someone-else", "standard")
    assert http.get(path, headers={"Authorization": f"Bearer {other}"}).status_code == 404
    bad = http.get(path, headers={**owner, "Last-Event-ID": "not-an-id"})
    assert bad.status_code == 422 and bad.json()["field"] == "Last-Event-ID"
    assert kinds(sse.read(http, path, owner))[-1] == "completed"


def test_a_waiting_predictions_place_is_sent_again_as_it_moves_up(http, owner, worker):
    gates = [uuid.uuid4().hex[:12] for _ in range(2)]
    first = create(http, owner, input={"prompt": f"gate:{gates[0]}", **SMALL})
    try:
        wait_until(lambda: at_gate(gates[0]), 30, what="the first job at its gate")
        create(http, owner, input={"prompt": f"gate:{gates[1]}", **SMALL})
        last = create(http, owner, model="echo", input={"text": "last"})
        got: list[dict] = []
        reader = threading.Thread(target=lambda: sse.read(
            http, last["urls"]["stream"], owner, into=got), daemon=True)
        reader.start()
        wait_until(lambda: got, 30, what="the queued event")
        assert got[0]["data"]["queue"]["position"] == 1 and "id" in got[0]
        open_gate(gates[0])  # the second job runs: the last is next
        wait_until(lambda: len(got) > 1, 30, what="its new place")
        assert got[1]["event"] == "queued" and "id" not in got[1]
        assert got[1]["data"]["queue"]["position"] == 0
    finally:
        for gate in gates:
            open_gate(gate)
    reader.join(60)
    assert kinds(got)[-3:] == ["started", "output", "completed"] and first["id"]
