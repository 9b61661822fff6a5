"""Lane depths are counters kept in the same step as every push, take, move, restore and
purge; the audit corrects them from the real lists; the due index follows the ledger."""
from __future__ import annotations

import base64
import json
import time

from conftest import SMALL

from beat.ledger import recover_lost
from beat.movers import age_relaxed, enforce_deadlines
from tasks import submit
from tasks.broker.keys import LANE_DEPTHS_KEY, LEDGER_KEY, LIST_DEPTHS_KEY, due_key, lane_keys
from tasks.settings import settings


def _depths(client) -> tuple[dict, dict]:
    def read(key):
        return {k.decode(): int(v) for k, v in client.hgetall(key).items()}
    return read(LANE_DEPTHS_KEY), read(LIST_DEPTHS_KEY)


def _lengths(client) -> dict[str, int]:
    """What the lists really hold, by lane and by list (non-empty ones)."""
    keys = [k for lane in ("fast", "standard", "relaxed") for k in lane_keys(lane)]
    return {k: n for k in keys if (n := client.llen(k))}


def test_pushes_takes_restores_and_purges_keep_the_counts_exact(app, clean_redis):
    for tier, n in (("fast", 2), ("standard", 3), ("relaxed", 4)):
        for _ in range(n):
            submit("p", tier=tier, **SMALL)
    light = lane_keys("relaxed")[1]  # an account's first level (the default account's)
    assert _depths(clean_redis) == ({"fast": 2, "standard": 3, "relaxed": 4},
                                    {"fast": 2, "standard": 3, light: 4})
    # every lane's fresh jobs are indexed (relaxed's step 0, where jobs age to, is not)
    assert clean_redis.zcard(due_key("standard")) == 3
    assert clean_redis.zcard(due_key("relaxed")) == 4
    with app.connection_for_write() as conn:
        channel = conn.default_channel
        taken = channel.basic_get("standard")  # a worker's take: recorded unacked
        assert _depths(clean_redis)[0]["standard"] == 2
        assert clean_redis.zcard(due_key("standard")) == 2
        channel.basic_reject(taken.delivery_tag, requeue=True)  # kombu's restore
        assert _depths(clean_redis)[0]["standard"] == 3
        assert clean_redis.zcard(due_key("standard")) == 3
        assert channel.queue_purge("relaxed") == 4
        assert clean_redis.zcard(due_key("relaxed")) == 0  # purged with them
    lanes, lists = _depths(clean_redis)
    assert lanes == {"fast": 2, "standard": 3} and lists == _lengths(clean_redis)
    assert clean_redis.hlen(LEDGER_KEY) == 5


def test_a_workers_brpop_take_counts_its_list_out_and_beat_drops_its_due_entry(app,
                                                                            clean_redis):
    """A worker takes with BRPOP: its take counts the message out of the list BRPOP named,
    without reading the ledger, and leaves the due index entry, which beat's movers drop
    once it is due (the ledger no longer has it), never moving anything for it."""
    for _ in range(3):
        submit("p", tier="standard", **SMALL)
    taken = []
    with app.connection_for_write() as conn:
        channel = conn.channel()
        channel.basic_qos(0, 1, False)
        channel.basic_consume("standard", False, taken.append, "test-consumer")
        conn.drain_events(timeout=5)  # BRPOP, as a worker's consumer takes
        assert len(taken) == 1
        assert _depths(clean_redis)[0] == {"standard": 2}
        assert _depths(clean_redis)[1] == _lengths(clean_redis)
        assert clean_redis.hlen(LEDGER_KEY) == 2
        assert clean_redis.zcard(due_key("standard")) == 3  # the taken one's entry stays
        moved = enforce_deadlines(clean_redis, {"standard": 0.0}, now=time.time() + 10_000)
        assert moved["standard"] == 2  # the two queued ones; nothing for the taken one
        assert clean_redis.zcard(due_key("standard")) == 0
        channel.basic_ack(taken[0].delivery_tag)
        channel.close()


def test_a_job_sent_to_a_queue_no_worker_bound_lands_in_its_shared_lane(app, clean_redis):
    """A worker's own queue with no binding (the worker never bound it, or its binding
    went): kombu would drop the message and the caller never know; it goes to the
    shared lane of its lane instead, ledgered and counted like any publish."""
    from tasks import submit

    job = submit("p", tier="standard", **SMALL)  # the shared lane, for its message shape
    raw = clean_redis.lpop(lane_keys("standard")[0])
    clean_redis.delete(LEDGER_KEY, LANE_DEPTHS_KEY, LIST_DEPTHS_KEY, due_key("standard"))
    message = json.loads(raw)
    with app.connection_for_write() as conn:
        producer = conn.Producer()
        producer.publish(json.loads(base64.b64decode(message["body"])), exchange="standard.ghost@h",
                         routing_key="standard.ghost@h", serializer="json",
                         headers=message["headers"], retry=False)
    assert clean_redis.llen(lane_keys("standard")[0]) == 1
    assert _depths(clean_redis)[0] == {"standard": 1} and clean_redis.hlen(LEDGER_KEY) == 1
    assert job.id in clean_redis.lindex(lane_keys("standard")[0], 0).decode()


def test_moves_carry_their_count_and_their_place_in_the_index(clean_redis):
    old = time.time() - 10_000
    for tier in ("fast", "fast", "relaxed"):
        submit("p", tier=tier, account="heavy", **SMALL)
    for tag in clean_redis.zrange(due_key("fast"), 0, -1):  # as if submitted long ago
        clean_redis.zadd(due_key("fast"), {tag: old})
    moved = enforce_deadlines(clean_redis, settings.max_wait_s, now=time.time())
    assert moved["fast"] == 0  # the index was ahead of the messages: they stay, indexed
    assert clean_redis.zcard(due_key("fast")) == 2
    moved = enforce_deadlines(clean_redis, settings.max_wait_s, now=time.time() + 10_000)
    assert moved["fast"] == 0  # fast jobs are not downgradable by default: left out
    assert clean_redis.zcard(due_key("fast")) == 0
    submit("q", tier="standard", **SMALL)
    assert enforce_deadlines(clean_redis, settings.max_wait_s,
                             now=time.time() + 10_000)["standard"] == 1
    lanes, lists = _depths(clean_redis)
    assert lanes == {"fast": 2, "relaxed": 2} and lists == _lengths(clean_redis)
    assert clean_redis.zcard(due_key("standard")) == 0


def test_aging_reads_the_index_of_the_higher_levels_only(clean_redis):
    from tasks.jobs.schema import validate
    from tasks.worker.generate import generate

    job = validate("p", tier="relaxed", account="a", model="demo", seed=1, **SMALL)
    generate.apply_async(kwargs={"job": job.encode(), "route": {"lane": "relaxed",
                         "requested_tier": "relaxed"}, "submitted_at": time.time() - 100},
                         queue="relaxed", priority=9)  # a heavy account's level
    assert clean_redis.zcard(due_key("relaxed")) == 1
    assert age_relaxed(clean_redis, aging_s=60) == 1
    assert clean_redis.zcard(due_key("relaxed")) == 0  # at the first level now
    assert _depths(clean_redis)[1] == {"relaxed": 1} == _lengths(clean_redis)


def test_the_audit_corrects_counts_gone_wrong(clean_redis, leading):
    for _ in range(3):
        submit("p", tier="standard", **SMALL)
    clean_redis.hset(LANE_DEPTHS_KEY, mapping={"standard": 7, "fast": 2})  # a lost write
    clean_redis.hset(LIST_DEPTHS_KEY, mapping={"standard": 1, "fast.gpu9@gone": 4})
    recover_lost(clean_redis, grace_s=60, audit=True)
    assert _depths(clean_redis) == ({"standard": 3}, {"standard": 3})


def test_an_ack_that_redis_does_not_answer_still_frees_the_workers_hand(app, clean_redis,
                                                                       monkeypatch):
    """With prefetch 1, a take kombu still counted after a lost ack would keep a worker
    from ever taking another job; the records left in Redis are settled later."""
    import pytest
    import redis

    submit("p", tier="standard", **SMALL)
    with app.connection_for_write() as conn:
        channel = conn.default_channel
        channel.basic_qos(prefetch_count=1)
        taken = channel.basic_get("standard")
        assert not channel.qos.can_consume()

        def frozen(tag):
            raise redis.TimeoutError("Timeout reading from socket")

        monkeypatch.setattr(channel.qos, "_drop_if_mine", frozen)
        with pytest.raises(redis.TimeoutError):
            channel.basic_ack(taken.delivery_tag)
        channel.qos._flush()  # kombu's in-memory acks
        assert channel.qos.can_consume()
        assert clean_redis.hexists("unacked", taken.delivery_tag)  # left for settle_orphans
