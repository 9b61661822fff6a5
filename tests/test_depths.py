"""Lane depths are counters kept in the same step as every push, take, move, give-back
and purge, as is the due index: a message's count and index entry follow it in the step
that moves it, so there is nothing to audit."""
from __future__ import annotations

import base64
import json
import time

from conftest import SMALL

from beat.movers import age_relaxed, enforce_deadlines
from routing.names import JOB_TASK
from tasks import submit
from tasks.broker import handover
from tasks.broker.keys import HELD_PREFIX, LANE_DEPTHS_KEY, LIST_DEPTHS_KEY, due_key, lane_keys
from tasks.broker.publish import Message, Pushed, envelope_of, publish
from tasks.settings import settings


def _depths(client) -> tuple[dict, dict]:
    """(jobs per lane, per list); the depths per lane also count each level of a lane,
    as "<lane>@<step>": those add up to the lane's (``_levels``)."""
    def read(key):
        return {k.decode(): int(v) for k, v in client.hgetall(key).items()}
    lanes = read(LANE_DEPTHS_KEY)
    for lane in {field.split("@")[0] for field in lanes}:
        assert sum(n for f, n in lanes.items() if f.startswith(lane + "@")) == lanes.get(lane, 0)
    return {f: n for f, n in lanes.items() if "@" not in f}, read(LIST_DEPTHS_KEY)


def _held(client) -> dict[str, tuple[str, str]]:
    """Every record of every holder: take token -> (list, message)."""
    return {token: record for key in client.keys(HELD_PREFIX + "*")
            for token, record in handover.held(client, key.decode()[len(HELD_PREFIX):]).items()}


def _lengths(client) -> dict[str, int]:
    """What the lists really hold, by lane and by list (non-empty ones)."""
    keys = [k for lane in ("fast", "standard", "relaxed") for k in lane_keys(lane)]
    return {k: n for k in keys if (n := client.llen(k))}


def test_pushes_takes_restores_and_purges_keep_the_counts_exact(app, clean_redis):
    for tier, n in (("fast", 2), ("standard", 3), ("relaxed", 4)):
        for i in range(n):
            submit("p", tier=tier, account=f"a{i}", **SMALL)
    # each lane's first level: accounts with a job or two there
    fast, standard, light = (lane_keys(lane)[1] for lane in ("fast", "standard", "relaxed"))
    assert _depths(clean_redis) == ({"fast": 2, "standard": 3, "relaxed": 4},
                                    {fast: 2, standard: 3, light: 4})
    # every lane's fresh jobs are indexed (relaxed's step 0, where jobs age to, is not)
    assert clean_redis.zcard(due_key("standard")) == 3
    assert clean_redis.zcard(due_key("relaxed")) == 4
    with app.connection_for_write() as conn:
        channel = conn.default_channel
        taken = channel.basic_get("standard")  # a worker's take: recorded as held
        assert _depths(clean_redis)[0]["standard"] == 2
        assert clean_redis.zcard(due_key("standard")) == 2
        channel.basic_reject(taken.delivery_tag, requeue=True)  # kombu's restore
        assert _depths(clean_redis)[0]["standard"] == 3
        assert clean_redis.zcard(due_key("standard")) == 3
        assert channel.queue_purge("relaxed") == 4
        assert clean_redis.zcard(due_key("relaxed")) == 0  # purged with them
    lanes, lists = _depths(clean_redis)
    assert lanes == {"fast": 2, "standard": 3} and lists == _lengths(clean_redis)
    assert lists == {fast: 2, standard: 3} and not _held(clean_redis)


def test_a_workers_take_counts_its_list_out_and_drops_its_due_entry(app, clean_redis):
    """A worker's take counts the message out of its list and drops its due index entry
    in the same step: beat's movers never read an entry for a message already taken."""
    for i in range(3):
        submit("p", tier="standard", account=f"a{i}", **SMALL)
    level0 = lane_keys("standard")[1]
    taken = []
    with app.connection_for_write() as conn:
        channel = conn.channel()
        channel.basic_qos(0, 1, False)
        channel.basic_consume("standard", False, taken.append, "test-consumer")
        conn.drain_events(timeout=5)  # a consumer's take, as a worker's
        assert len(taken) == 1
        assert _depths(clean_redis)[0] == {"standard": 2}
        assert _depths(clean_redis)[1] == _lengths(clean_redis) == {level0: 2}
        (record,) = _held(clean_redis).values()
        assert record[0] == level0 and taken[0].delivery_tag in record[1]
        assert clean_redis.zcard(due_key("standard")) == 2  # the taken one's entry went
        assert not any(record[1] in entry.decode()
                       for entry in clean_redis.zrange(due_key("standard"), 0, -1))
        moved = enforce_deadlines(clean_redis, {"standard": 0.0}, now=time.time() + 10_000)
        assert moved["standard"] == 2  # the two queued ones; nothing for the taken one
        assert clean_redis.zcard(due_key("standard")) == 0
        assert list(_held(clean_redis).values()) == [record]  # the held one stays held
        channel.basic_ack(taken[0].delivery_tag)
        assert not _held(clean_redis)
        channel.close()


def test_a_job_sent_to_a_queue_no_worker_bound_lands_in_its_shared_lane(app, clean_redis):
    """A worker's own queue with no binding (the worker never bound it, or its binding
    went): kombu would drop the message and the caller never know; it goes to the
    shared lane of its lane instead, counted and indexed like any publish."""
    from tasks import submit

    job = submit("p", tier="standard", **SMALL)  # the shared lane, for its message shape
    raw = clean_redis.lpop(lane_keys("standard")[1])  # its account's first level
    clean_redis.delete(LANE_DEPTHS_KEY, LIST_DEPTHS_KEY, due_key("standard"))
    message = json.loads(raw)
    with app.connection_for_write() as conn:
        producer = conn.Producer()
        producer.publish(json.loads(base64.b64decode(message["body"])), exchange="standard.ghost@h",
                         routing_key="standard.ghost@h", serializer="json",
                         headers=message["headers"], retry=False)
    assert clean_redis.llen(lane_keys("standard")[0]) == 1
    assert _depths(clean_redis) == ({"standard": 1}, {"standard": 1})
    (raw,) = clean_redis.lrange(lane_keys("standard")[0], 0, -1)
    assert job.id in raw.decode()
    assert clean_redis.zrange(due_key("standard"), 0, -1) == [b"standard\n" + raw]


def test_moves_carry_their_count_and_their_place_in_the_index(clean_redis):
    old = time.time() - 10_000
    for tier in ("fast", "fast", "relaxed"):
        submit("p", tier=tier, account="heavy", **SMALL)
    for entry in clean_redis.zrange(due_key("fast"), 0, -1):  # as if submitted long ago
        clean_redis.zadd(due_key("fast"), {entry: old})
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


def test_takes_repeated_give_backs_and_a_dead_holders_put_back_keep_the_counts_exact(
        clean_redis, leading):
    """Nothing corrects the counters: every step that moves a message counts it, once.
    A take repeated with its token (its answer lost) takes nothing more; a give-back of
    a record already given back gives nothing; beat's put-back of a dead holder counts
    what it returns."""
    from tasks.broker import leader

    for i in range(3):
        submit("p", tier="standard", account=f"a{i}", **SMALL)
    keys, level0 = lane_keys("standard"), lane_keys("standard")[1]
    first = handover.take(clean_redis, "dead", keys, "t1")
    assert handover.take(clean_redis, "dead", keys, "t1") == first  # sent again
    handover.take(clean_redis, "dead", keys, "t2")
    handover.take(clean_redis, "live", keys, "t3")
    assert _depths(clean_redis) == ({}, {}) and not _lengths(clean_redis)
    assert handover.put_back(clean_redis, "live", "t3") == 1
    assert handover.put_back(clean_redis, "live", "t3") == 0  # given back once only
    assert _depths(clean_redis) == ({"standard": 1}, {level0: 1})
    assert handover.put_back_all(clean_redis, "dead", epoch=leader.epoch()) == 2
    assert _depths(clean_redis) == ({"standard": 3}, {level0: 3}) == (
        {"standard": 3}, _lengths(clean_redis))
    assert not _held(clean_redis) and clean_redis.zcard(due_key("standard")) == 3


def test_an_ack_that_redis_does_not_answer_still_frees_the_workers_hand(app, clean_redis,
                                                                       monkeypatch):
    """With prefetch 1, a take kombu still counted after a lost ack would keep a worker
    from ever taking another job; the record left in Redis is dropped before the next
    take."""
    import redis

    from tasks.broker.holder import holder

    submit("p", tier="standard", **SMALL)
    with app.connection_for_write() as conn:
        channel = conn.default_channel
        channel.basic_qos(prefetch_count=1)
        taken = channel.basic_get("standard")
        assert not channel.qos.can_consume()
        ack = handover.ack

        def frozen(*args):
            raise redis.TimeoutError("Timeout reading from socket")

        monkeypatch.setattr(handover, "ack", frozen)
        channel.basic_ack(taken.delivery_tag)
        channel.qos._flush()  # kombu's in-memory acks
        assert channel.qos.can_consume()
        assert len(handover.held(clean_redis, holder())) == 1  # left for the next take
        monkeypatch.setattr(handover, "ack", ack)
        assert channel.basic_get("standard") is None  # the next take settles it first
        assert handover.held(clean_redis, holder()) == {}


def test_the_depths_per_list_stay_a_hash_table_past_a_few_dozen_lists(app, clean_redis):
    """Redis' compact hash finds a field by scanning them all: with a list per worker, a
    push would cost more with each worker (up to the compact encoding's limit)."""
    queues = [f"standard.gpu0@node{i}" for i in range(70)]
    for i, queue in enumerate(queues):
        sent = envelope_of(app, f"j{i}", JOB_TASK, {}, queue)
        assert publish(clean_redis, Message(queue, queue, sent, time.time())) == Pushed()
    assert clean_redis.object("encoding", LIST_DEPTHS_KEY) == b"hashtable"
    assert _depths(clean_redis) == ({"standard": 70}, {queue: 1 for queue in queues})
