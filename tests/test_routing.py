"""Routing v1 as pure functions, and the Celery router for direct callers."""
from __future__ import annotations

import pytest

from routing.lanes import Route, lane_for, route
from routing.names import JOB_TASK, JOB_TASK_ALIASES, LANES
from routing.router import route_task
from tasks.broker.store import redis_url


@pytest.mark.parametrize("tier", LANES)
def test_each_tier_has_its_lane(tier):
    assert lane_for(tier) == tier
    assert route(tier) == Route(lane=tier, requested_tier=tier)


def test_unknown_tier_is_refused():
    with pytest.raises(KeyError):
        lane_for("platinum")


def test_route_dict_omits_unset_fields():
    assert route("fast").as_dict() == {"lane": "fast", "requested_tier": "fast"}
    moved = Route("relaxed", "standard", "standard", "overload").as_dict()
    assert moved["downgraded_from"] == "standard" and moved["downgrade_reason"] == "overload"


def test_celery_router_sends_a_job_by_tier():
    kwargs = {"job": {"tier": "fast"}}
    assert route_task(JOB_TASK, (), kwargs, {}) == {"queue": "fast"}
    for old in JOB_TASK_ALIASES:  # a job sent under an earlier name goes to its lane too
        assert route_task(old, (), kwargs, {}) == {"queue": "fast"}
    assert route_task(JOB_TASK, (), {"job": {"tier": "bogus"}}, {}) == {"queue": "standard"}
    assert route_task(JOB_TASK, (), kwargs, {"queue": "relaxed"}) is None
    assert route_task("other.task", (), kwargs, {}) is None


def test_router_is_what_celery_uses(app):
    from tasks.worker.generate import generate

    routed = app.amqp.router.route({}, generate.name, (), {"job": {"tier": "relaxed"}})
    assert routed["queue"].name == "relaxed"


def test_redis_url_translation():
    assert redis_url("redis+socket:///tmp/x/redis.sock") == "unix:///tmp/x/redis.sock"
    assert redis_url("redis://:pw@host:6379/0") == "redis://:pw@host:6379/0"
    with pytest.raises(ValueError):
        redis_url("amqp://guest@localhost//")
