"""The queue protocol under gpulanes' own jobs: a message is always in a list or in its
holder's records, counted and indexed in the step that moves it."""
from __future__ import annotations

import time

import pytest

from conftest import SMALL

from tasks import submit
from tasks.broker import handover
from tasks.broker.keys import (
    HELD_PREFIX,
    LANE_DEPTHS_KEY,
    LIST_DEPTHS_KEY,
    due_key,
    lane_keys,
    list_key,
)


def _depths(client) -> tuple[dict, dict]:
    """(jobs per lane, per list), without the lanes' counts per level ("<lane>@<step>")."""
    return ({k.decode(): int(v) for k, v in client.hgetall(LANE_DEPTHS_KEY).items()
             if b"@" not in k},
            {k.decode(): int(v) for k, v in client.hgetall(LIST_DEPTHS_KEY).items()})


def _held(client) -> dict[str, tuple[str, str]]:
    return {token: record for key in client.keys(HELD_PREFIX + "*")
            for token, record in handover.held(client, key.decode()[len(HELD_PREFIX):]).items()}


def test_a_publish_is_counted_and_indexed_with_its_message(clean_redis):
    fast = submit("one", tier="fast", **SMALL)
    level0 = list_key("fast", 1)  # its account's first level of the lane
    (raw,) = clean_redis.lrange(level0, 0, -1)
    assert fast.id.encode() in raw
    assert _depths(clean_redis) == ({"fast": 1}, {level0: 1})
    (entry,) = clean_redis.zrange(due_key("fast"), 0, -1)
    assert entry == level0.encode() + b"\n" + raw  # what beat's movers read: list, message


def test_purge_and_delete_empty_the_lists_and_their_counts(app, clean_redis):
    submit("purged", tier="relaxed", **SMALL)
    submit("deleted", tier="standard", **SMALL)
    with app.connection_for_write() as conn:
        assert conn.default_channel.queue_purge("relaxed") == 1
        conn.default_channel._delete("standard", "standard", "standard", "")  # a queue delete
    assert not any(clean_redis.llen(key) for lane in ("relaxed", "standard")
                   for key in lane_keys(lane))
    assert _depths(clean_redis) == ({}, {})
    assert not clean_redis.zcard(due_key("standard"))


def test_a_take_records_its_holder_and_a_requeue_gives_it_back_in_one_step(app, clean_redis):
    from kombu import Consumer, Queue

    job = submit("taken through kombu", tier="standard", **SMALL)
    level0 = list_key("standard", 1)  # its account's first level of the lane
    (raw,) = clean_redis.lrange(level0, 0, -1)
    seen = []

    def take(body, message):
        seen.append((clean_redis.llen(level0), _depths(clean_redis)[0],
                     list(_held(clean_redis).values())))
        (message.ack if len(seen) > 1 else lambda: message.reject(requeue=True))()

    with app.connection_for_read() as conn:
        with Consumer(conn, [Queue("standard", no_declare=True)], callbacks=[take],
                      accept=["json"]):
            conn.drain_events(timeout=5)  # taken: out of its list, into its holder's records
            assert clean_redis.lrange(level0, 0, -1) == [raw]  # given back, as it was
            assert _depths(clean_redis)[0] == {"standard": 1} and not _held(clean_redis)
            conn.drain_events(timeout=5)
    record = (level0, raw.decode())
    assert seen == [(0, {}, [record]), (0, {}, [record])]
    assert not _held(clean_redis) and clean_redis.llen(level0) == 0 and job.id


def test_a_move_down_takes_its_count_and_index_entry_along(clean_redis):
    from beat.movers import enforce_deadlines

    submit("late", tier="fast", downgradable=True, **SMALL)
    enforce_deadlines(clean_redis, {"fast": 1.0}, now=time.time() + 60)
    (raw,) = clean_redis.lrange("standard", 0, -1)
    assert _depths(clean_redis) == ({"standard": 1}, {"standard": 1})
    assert not clean_redis.zcard(due_key("fast"))
    assert clean_redis.zrange(due_key("standard"), 0, -1) == [b"standard\n" + raw]


def test_a_stopping_process_takes_no_more_work_and_its_wait_ends_at_once(
        app, clean_redis, monkeypatch):
    """A worker told to stop (its warm shutdown) takes nothing more from its lanes, and
    a wait for work it is in ends as it is told: Celery's loop sees at once that it
    stops, rather than after two more waits of up to 2 s each."""
    import socket
    import threading

    from kombu import Consumer, Queue

    from tasks.broker import outage

    monkeypatch.setattr(outage, "_stopping", threading.Event())
    monkeypatch.setattr(outage, "_wakers", [])
    seen = []
    with app.connection_for_read() as conn:
        with Consumer(conn, [Queue("standard", no_declare=True)], accept=["json"],
                      callbacks=[lambda body, message: seen.append(message)]):
            threading.Timer(0.3, outage.stop_waiting).start()  # SIGTERM, mid-wait
            began = time.monotonic()
            with pytest.raises(socket.timeout):
                conn.drain_events(timeout=30)
            waited_s = time.monotonic() - began
            submit("sent as the worker stops", tier="standard", **SMALL)
            with pytest.raises(socket.timeout):
                conn.drain_events(timeout=30)
    assert waited_s < 10, f"the wait went on {waited_s:.1f} s after the stop"
    assert not seen and clean_redis.llen(list_key("standard", 1)) == 1  # left in its lane
    assert not _held(clean_redis)
