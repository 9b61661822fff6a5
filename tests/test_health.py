"""The health check's restore against kombu's own: a message goes back only if the
dead worker still holds it, never while another worker does."""
from __future__ import annotations

import json
import time

import celeryconfig as cfg
from tasks.broker.app import redis_client
from tasks.broker.keys import HOLDERS_KEY, lease_key
from tasks.broker.transport import Connection, put_back_held
from tasks.settings import settings
from tasks.worker.generate import generate


def _publish() -> str:
    return generate.apply_async(kwargs={"job": {}, "route": {}, "submitted_at": time.time()},
                                queue="standard").id


def _ids(client, key="standard") -> list[str]:
    return [json.loads(raw)["headers"]["id"] for raw in client.lrange(key, 0, -1)]


def _connection() -> Connection:
    return Connection(settings.broker_url, transport_options=cfg.broker_transport_options)


def test_a_dead_holders_message_goes_back_to_its_lane(clean_redis):
    job = _publish()
    with _connection() as worker, _connection() as beat:
        tag = worker.channel().basic_get("standard", no_ack=False).delivery_tag
        clean_redis.hset(HOLDERS_KEY, tag, "gpu0@h/1/1.0")  # its lease has lapsed: none
        assert put_back_held(beat.default_channel, redis_client(), tag, "gpu0@h/1/1.0")
        assert _ids(clean_redis) == [job]
    assert not clean_redis.hexists(HOLDERS_KEY, tag)


def test_a_silent_holder_that_still_extends_its_lease_keeps_the_message(clean_redis):
    job = _publish()
    with _connection() as worker, _connection() as beat:
        tag = worker.channel().basic_get("standard", no_ack=False).delivery_tag
        clean_redis.hset(HOLDERS_KEY, tag, "gpu0@h/1/1.0")
        clean_redis.set(lease_key(job), "gpu0@h/1/1.0", ex=5)  # a warm shutdown runs it
        assert not put_back_held(beat.default_channel, redis_client(), tag, "gpu0@h/1/1.0")
        assert _ids(clean_redis) == []
        clean_redis.delete(lease_key(job))  # it died: the lease lapses
        assert put_back_held(beat.default_channel, redis_client(), tag, "gpu0@h/1/1.0")
        assert _ids(clean_redis) == [job]


def test_a_message_another_worker_took_stays_with_it(clean_redis):
    """A message put back gets a new delivery tag: the worker that held the old copy,
    should it wake up, can only touch its own dead copy's records, never the new one's."""
    job = _publish()
    with _connection() as a, _connection() as b, _connection() as beat:
        channel_a = a.channel()
        old = channel_a.basic_get("standard", no_ack=False)
        clean_redis.hset(HOLDERS_KEY, old.delivery_tag, "gpu0@h/1/1.0")
        channel_a.qos.restore_unacked()  # A's warm shutdown: kombu puts the message back
        assert not clean_redis.hexists(HOLDERS_KEY, old.delivery_tag)
        new = b.channel().basic_get("standard", no_ack=False)
        assert new.headers["id"] == job and new.delivery_tag != old.delivery_tag
        clean_redis.hset(HOLDERS_KEY, new.delivery_tag, "gpu1@h/2/2.0")  # B's take
        assert not put_back_held(beat.default_channel, redis_client(), old.delivery_tag,
                                   "gpu0@h/1/1.0")
        channel_a.qos.ack(old.delivery_tag)  # A wakes up late and acks its copy
        assert clean_redis.hexists("unacked", new.delivery_tag)  # B's record stands
        assert clean_redis.hget(HOLDERS_KEY, new.delivery_tag) == b"gpu1@h/2/2.0"
        assert job not in _ids(clean_redis)  # B keeps it: nothing runs twice
