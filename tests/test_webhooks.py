"""Webhooks: a real worker and API, the sender (``celery -A tasks lanes webhooks``) in its
own process, and receivers in the test's process. Deliveries are checked with the
Standard Webhooks library, as a receiver would check them."""
from __future__ import annotations

import uuid

import httpx
import pytest
from conftest import SMALL, STATE_DIR, wait_until
from standardwebhooks.webhooks import Webhook

from tasks.errors import InvalidJob
from tasks.jobs import events, webhooks
from tasks.settings import override
from tests.flaky_model import at_gate, open_gate
from tests.harness.hooks import Receiver, Sender
from tests.harness.http import ApiServer

pytestmark = pytest.mark.cluster
LOGS = STATE_DIR / "logs" / "test_webhooks"
#: The API and sender here let webhooks reach the test's own receivers, on loopback.
LOOPBACK_OK = {"GPULANES_WEBHOOK_ALLOW_PRIVATE": "1"}
PACED = {"prompt": "pace:150 a slow fox", "steps": 8, "width": 64, "height": 64}


@pytest.fixture(scope="module")
def worker(cluster_factory):
    return cluster_factory(workers=1)


@pytest.fixture(scope="module")
def api(redis_server):
    with ApiServer(LOGS, env=LOOPBACK_OK) as server:
        yield server


@pytest.fixture
def owner(key):
    return key()


@pytest.fixture
def sender(redis_server):
    with Sender(LOGS, env=LOOPBACK_OK) as running:
        yield running


def create(http: httpx.Client, auth: dict, url: str, model: str = "flaky",
           **body) -> dict:
    made = http.post("/v1/predictions", json={"model": model, "webhook": url, **body},
                     headers=auth)
    assert made.status_code == 201, made.text
    return made.json()


def kinds_of(client, job_id: str) -> dict[str, str]:
    """Each webhook-id of the prediction's logged events, and the event's kind."""
    return {f"msg_{job_id}_{event.id}": event.kind for event in events.after(client, job_id)}


@pytest.mark.parametrize("url", [
    "http://127.0.0.1:9/hook", "http://localhost/hook", "http://10.1.2.3/", "http://[::1]/",
    "http://169.254.169.254/latest/meta-data", "http://192.168.0.1/", "http://[::ffff:127.0.0.1]/",
    "ftp://example.com/", "not a url"])
def test_a_webhook_into_the_clusters_own_network_is_refused_unless_allowed(url):
    with pytest.raises(InvalidJob) as refused:
        webhooks.checked(url, None)
    assert refused.value.field == "webhook"
    if url.startswith("http://"):
        with override(webhook_allow_private=True):
            assert webhooks.checked(url, ["completed"]) == (url, ("completed",))
    assert webhooks.public("8.8.8.8") and not webhooks.public("100.64.0.1")


def test_the_api_refuses_a_private_webhook_and_a_bad_filter_before_enqueueing(
        redis_server, clean_redis, owner):
    with ApiServer(LOGS, name="api-default") as strict, httpx.Client(base_url=strict.url) as h:
        private = h.post("/v1/predictions", headers=owner, json={
            "model": "echo", "input": {"text": "hi"}, "webhook": "http://127.0.0.1:9/"})
        assert private.status_code == 422 and private.json()["field"] == "webhook"
        assert "GPULANES_WEBHOOK_ALLOW_PRIVATE" in private.json()["detail"]
        bad = h.post("/v1/predictions", headers=owner, json={
            "model": "echo", "input": {"text": "hi"}, "webhook": "https://example.com/",
            "webhook_events_filter": ["logs"]})
        assert bad.status_code == 422 and "webhook_events_filter" in bad.text
        assert h.get("/v1/predictions", headers=owner).json()["results"] == []


def test_each_event_is_delivered_signed_with_a_stable_id_and_progress_spaced(
        http, owner, worker, sender, clean_redis):
    with Receiver() as receiver:
        made = create(http, owner, receiver.url, input=PACED)
        assert made["webhook_events_filter"] == ["start", "progress", "output", "completed"]
        wait_until(lambda: "succeeded" in {s for _, s in receiver.events(made["id"])}, 60,
                   what="the completed webhook")
        kinds = kinds_of(clean_redis, made["id"])
        got = list(receiver.got)
        sent = [kinds[d.headers["webhook-id"]] for d in got]
        assert len(sent) == len(set(d.headers["webhook-id"] for d in got))
        assert {"started", "completed"} <= set(sent) <= {"started", "progress", "completed"}
        assert got[sent.index("completed")].body["output"]["image"]["url"]
        secret = http.get("/v1/webhooks/default/secret", headers=owner).json()["key"]
        for delivery in got:
            Webhook(secret).verify(delivery.raw, delivery.headers)  # raises if forged
        forged = {**got[0].headers, "webhook-signature": "v1,AAAA"}
        with pytest.raises(Exception):
            Webhook(secret).verify(got[0].raw, forged)
        progress_at = sorted(event.at for event in events.after(clean_redis, made["id"])
                             if f"msg_{made['id']}_{event.id}" in
                             {d.headers["webhook-id"] for d in got}
                             and event.kind == "progress")
        assert all(b - a >= 0.5 for a, b in zip(progress_at, progress_at[1:]))
        only_end = create(http, owner, receiver.url, model="echo", input={"text": "hi"},
                          webhook_events_filter=["completed"])
        output = create(http, owner, receiver.url, model="echo", input={"text": "ho"},
                        webhook_events_filter=["output"])
        for one in (only_end, output):
            wait_until(lambda: receiver.events(one["id"]), 60, what="its one webhook")
        assert [s for _, s in receiver.events(only_end["id"])] == ["succeeded"]
        assert [kinds_of(clean_redis, output["id"])[i] for i, _ in
                receiver.events(output["id"])] == ["output"]


def test_a_receiver_down_a_while_gets_every_completed_event_once_back(
        http, owner, worker, sender):
    with Receiver() as receiver:
        receiver.down = True
        made = [create(http, owner, receiver.url, model="echo", input={"text": f"n{i}"},
                       webhook_events_filter=["completed"]) for i in range(5)]
        wait_until(lambda: receiver.tried >= 10, 30, what="deliveries tried while it is down")
        receiver.down = False
        for one in made:
            wait_until(lambda: receiver.events(one["id"]), 90, what="the completed webhook")
        ids = [webhook_id for one in made for webhook_id, _ in receiver.events(one["id"])]
        assert len(ids) == len(set(ids)) == 5


def test_a_sender_killed_mid_delivery_loses_none(http, owner, worker, clean_redis):
    with Receiver() as receiver, Sender(LOGS, env=LOOPBACK_OK, name="killed") as first:
        receiver.held.set()  # the receiver takes the request and never answers
        made = create(http, owner, receiver.url, model="echo", input={"text": "hi"},
                      webhook_events_filter=["completed"])
        wait_until(lambda: receiver.tried >= 1, 30, what="the delivery to be under way")
        first.kill()
        receiver.held.clear()
        receiver.released.set()
        with Sender(LOGS, env=LOOPBACK_OK, name="restarted"):
            wait_until(lambda: receiver.events(made["id"]), 60,
                       what="the delivery, sent again after its lease lapsed")
        assert [s for _, s in receiver.events(made["id"])] == ["succeeded"]


def test_a_receiver_that_never_answers_does_not_delay_another(http, owner, worker, sender):
    with Receiver() as silent, Receiver() as quick:
        silent.held.set()
        for i in range(12):
            create(http, owner, silent.url, model="echo", input={"text": f"s{i}"},
                   webhook_events_filter=["completed"])
        wait_until(lambda: silent.tried >= 8, 30, what="the silent receiver's slots filled")
        gate = uuid.uuid4().hex[:8]
        made = create(http, owner, quick.url, model="flaky",
                      input={"prompt": f"gate:{gate}", **SMALL},
                      webhook_events_filter=["start"])
        wait_until(lambda: at_gate(gate), 30, what="the job to start")
        started = wait_until(lambda: quick.events(made["id"]), 5,
                             what="the quick receiver's webhook while the other is silent")
        open_gate(gate)
        assert started and silent.tried >= 8


def test_a_sender_held_up_past_its_lease_leaves_the_delivery_to_the_next_take(clean_redis):
    """A delivery whose lease has less left than one attempt's timeout is not sent (the
    next take sends it): a sender held up since it took it sends no second copy."""
    import asyncio
    import time

    from tasks.front import hooks

    async def attempt(sender, lease_left_s: float):
        delivery = hooks.Delivery(f"{hooks.PREDICTION_PREFIX}{uuid.uuid4()} 1-0", time.time() + lease_left_s,
                                  0)
        try:
            return await sender.attempt(delivery, hooks.Prepared(receiver.url, "{}", "c2VjcmV0"))
        finally:
            await sender.http.aclose()

    with Receiver() as receiver, override(webhook_allow_private=True):
        assert asyncio.run(attempt(hooks.Sender(clean_redis), hooks.TIMEOUT_S - 1)) is None
        assert receiver.tried == 0
        assert asyncio.run(attempt(hooks.Sender(clean_redis), hooks.TIMEOUT_S + 1)) == ""
        assert receiver.tried == 1
