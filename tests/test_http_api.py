"""The HTTP API as callers meet it: ``celery -A tasks lanes api`` (uvicorn) in its own
processes, real workers behind it, keys made in the suite's Redis, httpx in front."""
from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import time
import uuid
from dataclasses import dataclass

import httpx
import pytest
from conftest import SMALL, STATE_DIR, new_gate, wait_at_gate, wait_until

from tasks import submit
from tasks.broker.keys import API_KEYS_KEY, FAST_BALANCE_KEY, admitted_key, parked_key
from tasks.jobs import apikeys
from tasks.jobs.plans import Plan
from tests.flaky_model import at_gate, open_gate
from tests.harness.http import ROOT, ApiServer, free_port

pytestmark = pytest.mark.cluster

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
FINAL = ("succeeded", "failed", "canceled")


@pytest.fixture(scope="module")
def worker(cluster_factory):
    return cluster_factory(workers=1)


@pytest.fixture(scope="module")
def api(redis_server):
    with ApiServer(STATE_DIR / "logs" / "test_http_api") as server:
        yield server


def create(http: httpx.Client, auth: dict, model: str = "echo", headers: dict | None = None,
           **body) -> httpx.Response:
    """POST a prediction of ``model`` (``body``: its input, tier...) with key ``auth``."""
    return http.post("/v1/predictions", json={"model": model, **body},
                     headers={**auth, **(headers or {})})


def finished(http: httpx.Client, headers: dict, prediction_id: str,
             timeout_s: float = 60.0) -> dict:
    """The prediction once it has ended."""
    def ended() -> dict | None:
        body = http.get(f"/v1/predictions/{prediction_id}", headers=headers).json()
        return body if body["status"] in FINAL else None
    return wait_until(ended, timeout_s, what=f"prediction {prediction_id} to end")


@dataclass(frozen=True)
class Held:
    gate: str
    url: str  #: the held prediction's
    auth: dict


@pytest.fixture
def held(worker, http, key):
    """The gate of a prediction that holds the one worker until the test opens it (or
    ends): predictions made meanwhile wait in their lanes."""
    gate, holder = uuid.uuid4().hex[:12], key("holder")
    made = create(http, holder, "flaky", input={"prompt": f"gate:{gate}", **SMALL}).json()
    wait_until(lambda: at_gate(gate), 30, what="the held job to reach its gate")
    yield Held(gate, made["urls"]["get"], holder)
    open_gate(gate)


# --- keys -----------------------------------------------------------------------------

def test_a_call_without_a_live_key_is_401_and_the_docs_are_open(http, key):
    for path in ("/v1/predictions", "/v1/models", f"/v1/predictions/{uuid.uuid4()}"):
        refused = http.get(path)
        assert refused.status_code == 401 and "Bearer" in refused.headers["WWW-Authenticate"]
        assert http.get(path, headers={"Authorization": "Bearer gl_not-a-key"}).status_code \
            == 401
    assert http.post("/v1/predictions", json={"model": "echo", "input": {"text": "hi"}}
                     ).status_code == 401
    assert http.get("/docs").status_code == 200
    assert "/v1/predictions" in http.get("/openapi.json").json()["paths"]


def test_the_docs_show_a_creates_body_headers_and_refusal(http):
    create = http.get("/openapi.json").json()["paths"]["/v1/predictions"]["post"]
    body = create["requestBody"]["content"]["application/json"]["schema"]
    assert body["required"] == ["model"] and set(body["properties"]) == {
        "model", "input", "tier", "downgradable", "webhook", "webhook_events_filter"}
    assert [p["name"] for p in create["parameters"]] == ["Idempotency-Key", "Cancel-After",
                                                       "Prefer"]
    assert {"201", "422"} <= set(create["responses"]) and create["security"]


def test_a_revoked_key_is_refused_at_once_by_a_process_that_kept_it(http, clean_redis):
    made, record = apikeys.create(clean_redis, "leaving")
    headers = {"Authorization": f"Bearer {made}"}
    assert http.get("/v1/predictions", headers=headers).status_code == 200
    raw = clean_redis.hget(API_KEYS_KEY, apikeys.digest(made))
    clean_redis.hdel(API_KEYS_KEY, apikeys.digest(made))  # gone, unannounced
    assert http.get("/v1/predictions", headers=headers).status_code == 200  # kept in memory
    clean_redis.hset(API_KEYS_KEY, apikeys.digest(made), raw)
    apikeys.revoke(clean_redis, record.id)  # announced: dropped from memory
    began = time.monotonic()
    wait_until(lambda: http.get("/v1/predictions", headers=headers).status_code == 401,
               timeout_s=2, what="the revoked key to be refused")
    assert time.monotonic() - began < 1.0


# --- predictions ----------------------------------------------------------------------

def test_an_image_prediction_runs_and_its_png_is_served_to_its_owner_only(http, key, worker):
    owner, other = key("owner"), key("someone-else")
    made = create(http, owner, "demo", input={"prompt": "a red fox", **SMALL}, tier="fast")
    assert made.status_code == 201, made.text
    body = made.json()
    assert body["status"] in ("starting", "processing", "succeeded")
    assert made.headers["Location"] == body["urls"]["get"]
    assert body["input"]["prompt"] == "a red fox" and isinstance(body["input"]["seed"], int)
    done = finished(http, owner, body["id"])
    assert done["status"] == "succeeded" and done["error"] is None, done
    image = done["output"]["image"]
    assert image["url"] == f"{body['urls']['get']}/files/image.png"
    assert done["timing"]["run_ms"] >= 0 and done["run"]["lane"] == "fast"
    assert str(STATE_DIR) not in json.dumps(done)  # the store's address is never shown
    png = http.get(image["url"], headers=owner)
    assert png.status_code == 200 and png.headers["content-type"] == "image/png"
    assert png.content.startswith(PNG_SIGNATURE)
    assert hashlib.sha256(png.content).hexdigest() == image["sha256"]
    assert http.get(image["url"]).status_code == 401
    for call in (lambda h: http.get(image["url"], headers=h),
                 lambda h: http.get(body["urls"]["get"], headers=h),
                 lambda h: http.post(body["urls"]["cancel"], headers=h)):
        assert call(other).status_code == 404
    assert http.get(f"{body['urls']['get']}/files/output-0.bin", headers=owner).status_code \
        == 404
    assert http.get(f"/v1/predictions/{uuid.uuid4()}", headers=owner).status_code == 404


def test_prefer_wait_answers_with_the_finished_prediction(http, key, worker):
    owner = key()
    made = create(http, owner, input={"text": "hi", "repeat": 2}, tier="fast",
                  headers={"Prefer": "wait=30"})
    assert made.status_code == 201 and made.headers["Preference-Applied"] == "wait=30"
    assert made.json()["status"] == "succeeded" and made.json()["output"] == {"text": "hihi"}


def test_a_running_prediction_shows_its_progress_and_a_failed_one_its_error(http, key,
                                                                           worker):
    owner = key()
    paced = create(http, owner, "flaky", input={"prompt": "pace:150 a slow fox", "steps": 8,
                                                "width": 64, "height": 64}).json()

    def progressing() -> dict | None:
        body = http.get(paced["urls"]["get"], headers=owner).json()
        return body.get("progress") if body["status"] == "processing" else None
    progress = wait_until(progressing, 30, what="the paced prediction to report a step")
    assert set(progress) == {"step", "steps", "eta_s", "lane"}
    assert progress["steps"] == 8 and progress["lane"] == "standard" and progress["step"] >= 1
    assert finished(http, owner, paced["id"])["status"] == "succeeded"
    failed = create(http, owner, "flaky", input={"prompt": "bug", **SMALL},
                    headers={"Prefer": "wait=30"}).json()
    assert failed["status"] == "failed" and "simulated bug" in failed["error"]
    assert failed["output"] is None


def test_a_class_models_files_are_served_through_the_api(http, key, worker):
    owner = key()
    done = create(http, owner, "odd", input={"kind": "artifacts"},
                  headers={"Prefer": "wait=30"}).json()
    assert done["status"] == "succeeded", done
    red, black = done["output"]["images"]
    blob = done["output"]["blob"]
    base = f"{done['urls']['get']}/files"
    assert (red["url"], black["url"], blob["url"]) == \
        (f"{base}/image.png", f"{base}/image-1.png", f"{base}/output-0.bin")
    assert http.get(blob["url"], headers=owner).content == b"\x00\x01binary"
    assert http.get(red["url"], headers=owner).content.startswith(PNG_SIGNATURE)


@pytest.mark.parametrize("body, headers, field", [
    ({"model": "echo", "input": {"text": "hi", "repeat": 9}}, {}, "input.repeat"),
    ({"model": "echo", "input": {"text": ""}}, {}, "input.text"),
    ({"model": "echo", "input": {"text": "hi", "colour": "red"}}, {}, "input.colour"),
    ({"model": "echo", "input": {"text": "hi", "account": "victim"}}, {}, "input.account"),
    ({"model": "nope", "input": {"text": "hi"}}, {}, "model"),
    ({"input": {"text": "hi"}}, {}, "model"),
    ({"model": "echo", "input": {"text": "hi"}, "tier": "turbo"}, {}, "tier"),
    ({"model": "echo", "input": {"text": "hi"}}, {"Cancel-After": "soon"}, "Cancel-After"),
    ({"model": "echo", "input": {"text": "hi"}}, {"Idempotency-Key": "x" * 300},
     "Idempotency-Key"),
])
def test_a_bad_request_is_422_naming_the_field(http, key, body, headers, field):
    refused = http.post("/v1/predictions", json=body, headers={**key(), **headers})
    assert refused.status_code == 422 and refused.json()["field"] == field, refused.text
    assert field.split(".")[-1] in refused.json()["detail"]


def test_a_body_over_the_limit_is_refused_unread(http, key):
    """Over 6 x GPULANES_MAX_INPUT_BYTES (64 KiB) and 16 KiB: refused by its length, or
    as its chunks arrive when it gives none."""
    headers = {**key(), "Content-Type": "application/json"}

    def chunks():
        yield b'{"model": "echo", "input": {"text": "'
        yield from (b"x" * 10_000 for _ in range(60))
        yield b'"}}'
    for body in (b"".join(chunks()), chunks()):
        refused = http.post("/v1/predictions", content=body, headers=headers)
        assert refused.status_code == 413, refused.text
        assert "GPULANES_MAX_INPUT_BYTES" in refused.json()["detail"]


def test_models_are_listed_with_their_input_schemas(http, key):
    models = {m["name"]: m for m in http.get("/v1/models", headers=key()).json()["results"]}
    echo = models["echo"]["input_schema"]
    assert models["echo"]["kind"] == "class" and echo["required"] == ["text"]
    assert echo["properties"]["repeat"]["maximum"] == 8
    demo = models["demo"]
    assert demo["kind"] == "image" and demo["input_schema"]["properties"]["prompt"]["maxLength"] \
        == 2000
    assert {"seed", "steps", "width", "height"} <= set(demo["input_schema"]["properties"])


def test_the_list_is_the_callers_own_newest_first_a_page_at_a_time(http, key, worker):
    owner, other = key("lister"), key("not-listed")
    create(http, other, input={"text": "elsewhere"})
    ids = [create(http, owner, input={"text": f"job {i}"}).json()["id"] for i in range(5)]
    first = http.get("/v1/predictions", params={"limit": 2}, headers=owner).json()
    assert [p["id"] for p in first["results"]] == ids[::-1][:2]
    newer = create(http, owner, input={"text": "made meanwhile"}).json()["id"]
    second = http.get(first["next"], headers=owner).json()  # the page after, as it was
    third = http.get(second["next"], headers=owner).json()
    assert [p["id"] for p in second["results"] + third["results"]] == ids[::-1][2:]
    assert third["next"] is None
    everything = http.get("/v1/predictions", params={"limit": 100}, headers=owner).json()
    assert [p["id"] for p in everything["results"]] == [newer, *ids[::-1]]
    assert http.get("/v1/predictions", params={"cursor": "nonsense"}, headers=owner).json()[
        "field"] == "cursor"


def test_a_queued_prediction_shows_its_place_and_a_cancel_keeps_it_from_running(
        http, key, held, app):
    owner = key()
    assert http.get(held.url, headers=held.auth).json()["status"] == "processing"
    first, second = (create(http, owner, input={"text": t}).json() for t in ("one", "two"))
    assert first["status"] == "starting" and first["queue"]["lane"] == "standard"
    assert (first["queue"]["position"], second["queue"]["position"]) == (0, 1)
    cancelled = http.post(first["urls"]["cancel"], headers=owner)
    assert cancelled.status_code == 200 and cancelled.json()["status"] == "canceled"
    open_gate(held.gate)
    assert finished(http, owner, second["id"])["output"] == {"text": "two"}
    assert finished(http, owner, first["id"])["output"] is None
    wait_until(lambda: app.AsyncResult(first["id"]).state == "REVOKED", 10,
               what="the cancelled job to be dropped, not run")


# --- what the lead's submit() adds: idempotency, Cancel-After, plans ------------------

def test_an_idempotency_key_makes_one_prediction(http, key, worker):
    owner, other = key("retrier"), key("another")
    headers = {"Idempotency-Key": "order-1234"}
    first = create(http, owner, input={"text": "once"}, headers=headers)
    again = create(http, owner, input={"text": "once"}, headers=headers)
    assert first.status_code == again.status_code == 201
    assert again.json()["id"] == first.json()["id"]
    elsewhere = create(http, other, input={"text": "once"}, headers=headers).json()
    assert elsewhere["id"] != first.json()["id"]  # a key is its account's own
    listed = http.get("/v1/predictions", headers=owner).json()["results"]
    assert [p["id"] for p in listed] == [first.json()["id"]]


def test_cancel_after_drops_a_prediction_still_queued_then(http, key, held, app):
    owner = key()
    made = create(http, owner, input={"text": "too late"}, headers={"Cancel-After": "500ms"})
    assert made.status_code == 201 and "cancel_after_at" in made.json()
    assert made.json()["status"] == "starting"
    assert finished(http, owner, made.json()["id"], timeout_s=10)["status"] == "canceled"
    open_gate(held.gate)
    wait_until(lambda: app.AsyncResult(made.json()["id"]).state == "REVOKED", 30,
               what="the lapsed job to be dropped, not run")


def test_a_plan_over_its_queued_jobs_is_429_with_retry_after(http, key, held):
    owner = key("small-studio", "basic")  # 3 jobs at once, 10 more waiting
    made = [create(http, owner, input={"text": f"job {i}"}) for i in range(13)]
    assert all(m.status_code == 201 for m in made), [m.text for m in made]
    refused = create(http, owner, input={"text": "one too many"})
    assert refused.status_code == 429, refused.text
    assert int(refused.headers["Retry-After"]) >= 1 and refused.json()["limit"] == "queued_jobs"


def test_spent_fast_time_without_relax_is_402_with_the_renewal(http, key, worker):
    from tasks.jobs.accounts import grant_fast_seconds
    from tasks.jobs.plans import plan

    owner = key("basic-studio", "basic")
    assert create(http, owner, input={"text": "fast"}, tier="fast",
                  headers={"Prefer": "wait=30"}).json()["status"] == "succeeded"
    grant_fast_seconds("basic-studio", -plan("basic").fast_seconds - 60)
    refused = create(http, owner, input={"text": "fast again"}, tier="fast")
    assert refused.status_code == 402, refused.text
    renewal = refused.json()
    assert renewal["renews_at_unix"] > time.time() and renewal["renews_at"].startswith("20")


# --- processes ----------------------------------------------------------------------

def test_several_processes_serve_one_port_and_redis_away_is_503(redis_server, clean_redis):
    made, record = apikeys.create(clean_redis, "many")
    headers = {"Authorization": f"Bearer {made}"}
    with ApiServer(STATE_DIR / "logs" / "test_http_api", workers=2, name="api-2") as two:
        with httpx.Client(base_url=two.url, timeout=10) as http:
            assert all(http.get("/v1/predictions", headers=headers).status_code == 200
                       for _ in range(10))
            apikeys.revoke(clean_redis, record.id)
            wait_until(lambda: all(http.get("/v1/predictions", headers=headers).status_code
                                   == 401 for _ in range(10)), 2, what="every process to refuse")
    away = f"redis://127.0.0.1:{free_port()}/0"
    env = {"GPULANES_BROKER_URL": away, "GPULANES_RESULT_BACKEND": away,
           "GPULANES_REDIS_TIMEOUT_S": "1"}
    with ApiServer(STATE_DIR / "logs" / "test_http_api", env=env, name="api-away") as alone:
        began = time.monotonic()
        refused = httpx.get(f"{alone.url}/v1/models", headers=headers, timeout=10)
        assert refused.status_code == 503 and int(refused.headers["Retry-After"]) >= 1
        assert time.monotonic() - began < 3


def test_the_api_loads_no_worker_code():
    """Built, and its built-in models described, the app has loaded none of the worker
    (the import-linter contract says the same of its imports; this is what runs)."""
    probe = ("import json, sys; from tasks.front.app import create_app; create_app(); "
             "from tasks.front.catalog import models; models(); "
             "print(json.dumps(sorted(sys.modules)))")
    env = {k: v for k, v in os.environ.items() if k != "GPULANES_MODELS"}
    loaded = json.loads(subprocess.run([sys.executable, "-c", probe], capture_output=True,
                                       text=True, cwd=ROOT, env=env, check=True).stdout)
    heavy = ("torch", "numpy", "PIL", "gpu_worker", "tasks.worker")
    assert not [m for m in loaded if m.split(".")[0] in heavy or m.startswith("tasks.worker")]
    assert "fastapi" in loaded and "tasks.jobs.image" in loaded


# --- a plan's line and Cancel-After, through submit() on the same worker ---------------
# (no beat runs here: a parked job enters its lane only as the worker says a job ended)

ONE_AT_A_TIME = Plan(name="one", fast_seconds=3600, concurrent_fast=1, concurrent_jobs=1,
                     queued_jobs=10)


def test_each_job_that_ends_lets_its_accounts_next_parked_one_in(worker, clean_redis):
    gate = new_gate()  # the first job is held running while the others are sent
    results = [submit(f"gate:{gate} hold", model="flaky", account="acme", plan=ONE_AT_A_TIME,
                      **SMALL)]
    results += [submit("p", account="acme", plan=ONE_AT_A_TIME, **SMALL) for _ in range(3)]
    wait_at_gate(results[0], gate)
    assert clean_redis.llen(parked_key("acme")) == 3  # one admitted, three parked
    open_gate(gate)
    done = [r.get(timeout=60) for r in results]
    assert [d["attempts"] for d in done] == [1] * 4
    wait_until(lambda: clean_redis.zcard(admitted_key("acme")) == 0, 10,
               what="the last admission to be released")
    assert clean_redis.llen(parked_key("acme")) == 0


def test_a_job_still_queued_at_its_cancel_after_never_runs_and_is_not_charged(
        worker, clean_redis):
    gate = new_gate()
    holding = submit(f"gate:{gate} hold", model="flaky", account="acme", plan=ONE_AT_A_TIME,
                     **SMALL)
    wait_at_gate(holding, gate)
    late = submit("p", tier="fast", account="acme", plan=ONE_AT_A_TIME, cancel_after=0.5,
                  **SMALL)
    balance = float(clean_redis.hget(FAST_BALANCE_KEY, "acme"))
    time.sleep(0.6)  # its deadline passes while it waits behind the held job
    open_gate(gate)
    holding.get(timeout=60)
    wait_until(lambda: late.state == "REVOKED", 30, what="the late job to be revoked")
    assert float(clean_redis.hget(FAST_BALANCE_KEY, "acme")) == balance
    wait_until(lambda: clean_redis.zcard(admitted_key("acme")) == 0, 10,
               what="its admission to be released")

