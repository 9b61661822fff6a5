"""The broker's publish, called directly (``tasks.broker.publish``): the envelope it
writes is the one kombu's producer writes, and its verdicts are typed."""
from __future__ import annotations

import json

from routing.names import JOB_TASK
from routing.policy import publish_limits
from tasks.broker.app import app
from tasks.broker.keys import LANE_DEPTHS_KEY
from tasks.broker.publish import (Conditions, Pushed, Refusal, Refused, envelope_of, named,
                                  publish)
from tests.harness.publishing import job_message

KWARGS = {"job": {"tier": "standard"}, "route": {"lane": "standard"}, "submitted_at": 1.5}


def _comparable(envelope: dict) -> dict:
    """An envelope less what differs by design: the delivery tag (new for each message),
    and what Celery's ``send_task`` adds by the way: the call's reprs copied into the
    properties, ``ignore_result`` None for False, the default exchange ''."""
    properties = {k: v for k, v in envelope["properties"].items()
                  if k not in ("delivery_tag", "argsrepr", "kwargsrepr")}
    properties["delivery_info"] = {**properties["delivery_info"], "exchange": "standard"}
    headers = {**envelope["headers"], "ignore_result": bool(envelope["headers"]["ignore_result"])}
    return {**envelope, "headers": headers, "properties": properties}


def test_the_envelope_is_the_one_kombus_producer_writes(clean_redis):
    app.send_task(JOB_TASK, task_id="j1", kwargs=KWARGS, queue="standard", retry=False,
                  argsrepr="()", kwargsrepr="{}")
    theirs = json.loads(clean_redis.rpop("standard"))
    ours = envelope_of(app, "j1", JOB_TASK, KWARGS, "standard", argsrepr="()", kwargsrepr="{}")
    assert _comparable(ours) == _comparable(theirs)
    assert ours["properties"]["delivery_tag"] != theirs["properties"]["delivery_tag"]


def test_limits_refuse_by_name_and_write_nothing(clean_redis):
    clean_redis.hset(LANE_DEPTHS_KEY, "standard", 3)
    full = Conditions(limits=publish_limits("standard", 3, None))
    assert publish(clean_redis, job_message("a"), full) == Refused(Refusal.FULL)
    assert clean_redis.llen("standard") == 0
    assert publish(clean_redis, job_message("b"), Conditions(
        limits=publish_limits("standard", 4, None))) == Pushed()
    assert clean_redis.llen("standard") == 1
    assert publish(clean_redis, job_message("c"), Conditions(deadline=1.0)) == Refused(Refusal.LATE)
    assert int(clean_redis.hget(LANE_DEPTHS_KEY, "standard")) == 4


def test_a_publish_asked_for_its_place_answers_how_many_entered_its_lane_before(
        clean_redis):
    placed = Conditions(placed=True)
    assert [publish(clean_redis, job_message(job_id, entered_at=at), placed)
            for job_id, at in (("a", 10.0), ("b", 12.0), ("c", 11.0))] == \
        [Pushed(0), Pushed(1), Pushed(1)]
    assert publish(clean_redis, job_message("d", "relaxed"), placed) == Pushed(None)  # unkept
    assert publish(clean_redis, job_message("e")) == Pushed()  # not asked


def test_named_arguments_leave_out_what_is_not_set():
    assert named(a=1, b=None, c="x") == ["a", 1, "c", "x"]
