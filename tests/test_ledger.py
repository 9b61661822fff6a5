"""The publish ledger: a job popped by a worker that died before recording it comes back."""
from __future__ import annotations

import json
import time

import pytest
from conftest import SMALL, new_gate, wait_at_gate, wait_until

from beat.ledger import RECOVERED_FIELD, missing, recover_lost
from tasks import submit
from tasks.broker.keys import LEDGER_KEY, LEDGER_SUSPECTS_KEY, METRICS_KEY, attempts_key, lists_key
from tasks.broker.keys import lane_keys, parse_entry
from tests.flaky_model import open_gate


def _tags(client, lane: str) -> list[str]:
    return [json.loads(raw)["properties"]["delivery_tag"] for raw in client.lrange(lane, 0, -1)]


def _entries(client) -> dict[str, tuple[str, str]]:
    return {t.decode(): parse_entry(e) for t, e in client.hgetall(LEDGER_KEY).items()}


def test_every_publish_is_in_the_ledger_with_its_list(clean_redis):
    submit("one", tier="fast", **SMALL)
    submit("two", tier="relaxed", **SMALL)
    entries = _entries(clean_redis)
    assert len(entries) == 2
    for tag, (key, message) in entries.items():
        assert clean_redis.lrange(key, 0, -1) == [message.encode()]
        assert json.loads(message)["properties"]["delivery_tag"] == tag
    assert not missing(clean_redis)


def test_a_message_popped_and_never_recorded_is_put_back_after_the_grace(clean_redis, leading):
    kept = submit("kept", tier="standard", **SMALL)
    lost = submit("lost", tier="standard", **SMALL)
    raw = clean_redis.rpop("standard")  # a worker's BRPOP, then SIGKILL: nothing else
    assert json.loads(raw)["headers"]["id"] == kept.id
    now = time.time()
    assert recover_lost(clean_redis, grace_s=2, now=now, audit=True) == 0  # maybe a pop
    # in progress: noted, not yet put back
    assert clean_redis.hexists(LEDGER_SUSPECTS_KEY, json.loads(raw)["properties"]["delivery_tag"])
    assert recover_lost(clean_redis, grace_s=2, now=now + 3) == 1
    assert clean_redis.hget(METRICS_KEY, RECOVERED_FIELD) == b"1"  # gpulanes_recovered_total
    back = [json.loads(m) for m in clean_redis.lrange("standard", 0, -1)]
    assert [m["headers"]["id"] for m in back] == [lost.id, kept.id]  # at the front: next
    new_tag = back[-1]["properties"]["delivery_tag"]  # a new tag: the lost copy's records,
    assert new_tag != json.loads(raw)["properties"]["delivery_tag"]  # if it ever wakes,
    assert set(_entries(clean_redis)) == {new_tag, _tags(clean_redis, "standard")[0]}
    assert recover_lost(clean_redis, grace_s=2, now=now + 6, audit=True) == 0  # once only
    assert not clean_redis.exists(LEDGER_SUSPECTS_KEY)


def test_the_audit_forgets_empty_lists_and_a_put_back_adds_its_list_again(clean_redis,
                                                                          leading):
    """Lane depth is read from each lane's set of lists: empty ones leave it once a
    minute, a list that holds a job is always in it."""
    submit("waits", tier="relaxed", **SMALL)
    submit("lost", tier="standard", **SMALL)
    clean_redis.rpop("standard")  # popped by a worker that died at once: list empty
    now = time.time()
    assert recover_lost(clean_redis, grace_s=2, now=now, audit=True) == 0
    assert clean_redis.smembers(lists_key("standard")) == set()
    assert clean_redis.smembers(lists_key("relaxed")) == {lane_keys("relaxed")[1].encode()}
    assert recover_lost(clean_redis, grace_s=2, now=now + 3) == 1
    assert clean_redis.smembers(lists_key("standard")) == {b"standard"}
    assert clean_redis.llen("standard") == 1


def test_a_list_that_joins_the_lanes_while_the_ledger_is_read_is_read_too(monkeypatch,
                                                                          clean_redis):
    import beat.ledger as ledger

    submit("queued", tier="standard", **SMALL)
    monkeypatch.setattr(ledger, "_lists", lambda client: [])  # read before its list joined
    assert not missing(clean_redis)
    assert ledger._sizes(clean_redis) == (1, 1)


def test_a_message_taken_properly_or_finished_is_never_put_back(clean_redis, leading):
    taken = submit("taken", tier="fast", **SMALL)
    done = submit("done", tier="fast", **SMALL)
    for raw in [clean_redis.rpop("fast"), clean_redis.rpop("fast")]:
        message = json.loads(raw)
        tag = message["properties"]["delivery_tag"]
        if message["headers"]["id"] == taken.id:
            clean_redis.hset("unacked", tag, json.dumps([message, "fast", "fast"]))
        else:
            clean_redis.set(f"gpulanes:done:{done.id}", "{}")
    now = time.time()
    assert recover_lost(clean_redis, grace_s=0, now=now, audit=True) == 0
    assert clean_redis.llen("fast") == 0 and clean_redis.hlen(LEDGER_KEY) == 0


def test_purge_and_delete_empty_the_ledger_too(app, clean_redis):
    submit("purged", tier="relaxed", **SMALL)
    submit("deleted", tier="standard", **SMALL)
    with app.connection_for_write() as conn:
        assert conn.default_channel.queue_purge("relaxed") == 1
        conn.default_channel._delete("standard", "standard", "standard", "")  # a queue delete
    assert not any(clean_redis.llen(key) for lane in ("relaxed", "standard")
                   for key in lane_keys(lane))
    assert clean_redis.hlen(LEDGER_KEY) == 0


def test_a_take_drops_the_entry_and_a_requeue_writes_it_again(app, clean_redis):
    from kombu import Consumer, Queue

    job = submit("taken through kombu", tier="standard", **SMALL)
    seen = []

    def take(body, message):
        seen.append((clean_redis.hlen(LEDGER_KEY), clean_redis.hlen("unacked")))
        (message.ack if len(seen) > 1 else lambda: message.reject(requeue=True))()

    with app.connection_for_read() as conn:
        with Consumer(conn, [Queue("standard", no_declare=True)], callbacks=[take],
                      accept=["json"]):
            conn.drain_events(timeout=5)  # taken: out of the ledger, into unacked
            assert _entries(clean_redis)  # requeued: in the list and the ledger again
            conn.drain_events(timeout=5)
    assert seen == [(0, 1), (0, 1)]
    assert clean_redis.hlen(LEDGER_KEY) == clean_redis.hlen("unacked") == 0
    assert clean_redis.llen("standard") == 0 and job.id


def test_a_move_down_takes_the_entry_along(clean_redis):
    from beat.movers import enforce_deadlines

    submit("late", tier="fast", downgradable=True, **SMALL)
    enforce_deadlines(clean_redis, {"fast": 1.0}, now=time.time() + 60)
    ((key, message),) = _entries(clean_redis).values()
    assert key == "standard" and clean_redis.lrange("standard", 0, -1) == [message.encode()]


@pytest.mark.cluster
def test_beat_puts_a_lost_job_back_and_a_worker_runs_it(cluster_factory, clean_redis):
    cluster_factory(workers=1, beat=True)
    gate = new_gate()
    blocker = submit(f"gate:{gate} hold the worker", model="flaky", tier="fast", **SMALL)
    wait_at_gate(blocker, gate)  # the only worker is busy: it takes nothing more
    lost = submit("popped by a worker that died", tier="standard", **SMALL)
    (key, _), = _entries(clean_redis).values()  # the shared lane or the worker's own queue
    assert json.loads(clean_redis.rpop(key))["headers"]["id"] == lost.id
    open_gate(gate)
    assert lost.get(timeout=60)["job_id"] == lost.id  # beat put it back; it ran once
    assert int(clean_redis.get(attempts_key(lost.id))) == 1
    blocker.get(timeout=60)
    wait_until(lambda: clean_redis.hlen(LEDGER_KEY) == 0, what="an empty ledger")
    assert not clean_redis.exists(LEDGER_SUSPECTS_KEY)
