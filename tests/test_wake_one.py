"""A push wakes one idle consumer of its queue, on that consumer's own channel, whatever
the number of consumers subscribed: a take that finds nothing records its taker as idle,
one that finds a job drops the record, a gone consumer is skipped, and records of
consumers gone stop counting once they age past the keep."""
from __future__ import annotations

import time
from contextlib import contextmanager, suppress
from typing import Iterator

import pytest
import redis
from conftest import TEST_ENV
from kombu import Connection, Exchange, Queue

from routing.names import FAST, STANDARD
from tasks.broker import handover
from tasks.broker.keys import CONSUMER_WAKE_PREFIX, WAKE_PREFIX, lane_keys, wake_key
from tasks.broker.lanes import IDLE_TAKE_S

DONE = "done"  # published after the pushes: a subscriber that hears it heard all before


@pytest.fixture(autouse=True)
def no_one_idle(clean_redis):
    """No consumer idle from before (the tests' Redis keeps the wake sets between tests)."""
    for key in clean_redis.scan_iter(f"{WAKE_PREFIX}*"):
        clean_redis.delete(key)


@contextmanager
def consumers(client: redis.Redis, count: int) -> Iterator[list]:
    """``count`` pub/sub connections, each subscribed to its own wake-up channel."""
    subs = []
    try:
        for n in range(count):
            sub = client.pubsub(ignore_subscribe_messages=True)
            sub.subscribe(f"{CONSUMER_WAKE_PREFIX}c{n}")
            sub.get_message(timeout=1.0)  # the confirmation: subscribed from here on
            subs.append(sub)
        yield subs
    finally:
        for sub in subs:
            sub.close()


def idle(client: redis.Redis, n: int, lanes: tuple[str, ...] = (STANDARD,)) -> None:
    """Consumer ``n`` takes from ``lanes`` and finds nothing: recorded as idle there."""
    keys = [key for lane in lanes for key in lane_keys(lane)]
    assert handover.take(client, f"h{n}", keys, f"t{n}-{time.monotonic()}",
                         wake=f"{CONSUMER_WAKE_PREFIX}c{n}") is None


def woken(client: redis.Redis, subs: list) -> list[int]:
    """How many wake-ups each subscriber got (read up to a closing message of its own)."""
    counts = []
    for n, sub in enumerate(subs):
        client.publish(f"{CONSUMER_WAKE_PREFIX}c{n}", DONE)
        heard = 0
        while (message := sub.get_message(timeout=2.0)) and message["data"] != DONE.encode():
            heard += 1
        assert message, f"subscriber {n} heard nothing, not even its closing message"
        counts.append(heard)
    return counts


def test_a_push_wakes_exactly_one_of_the_idle_consumers(clean_redis):
    with consumers(clean_redis, 5) as subs:
        for n in range(5):
            idle(clean_redis, n, (FAST, STANDARD))
        assert clean_redis.zcard(wake_key(STANDARD)) == 5
        handover.push(clean_redis, STANDARD, '{"n": 1}')
        counts = woken(clean_redis, subs)
        assert sorted(counts) == [0, 0, 0, 0, 1]
        assert clean_redis.zcard(wake_key(STANDARD)) == 4  # the one woken left the set
        [taker] = [n for n, count in enumerate(counts) if count]
        got = handover.take(clean_redis, "h", lane_keys(FAST) + lane_keys(STANDARD), "t",
                            wake=f"{CONSUMER_WAKE_PREFIX}c{taker}")
        assert got.raw == '{"n": 1}'
        member = f"{CONSUMER_WAKE_PREFIX}c{taker}".encode()
        assert member not in clean_redis.zrange(wake_key(FAST), 0, -1)  # busy: in none


def test_a_gone_consumer_is_skipped_and_dropped(clean_redis):
    with consumers(clean_redis, 3) as subs:
        for n in range(3):
            idle(clean_redis, n)
        subs[2].close()  # the latest idle, tried first, is gone: its channel heard by none
        handover.push(clean_redis, STANDARD, '{"n": 1}')
        assert sorted(woken(clean_redis, subs[:2])) == [0, 1]
        assert clean_redis.zcard(wake_key(STANDARD)) == 1


def test_a_consumer_woken_twice_passes_a_wake_up_on(clean_redis):
    """Idle on both lanes and the latest, consumer 1 is picked by a push to each; its
    take gets one job and wakes consumer 0 for the other."""
    with consumers(clean_redis, 2) as subs:
        idle(clean_redis, 0, (STANDARD,))
        idle(clean_redis, 1, (FAST, STANDARD))
        handover.push(clean_redis, FAST, '{"n": 1}')
        handover.push(clean_redis, STANDARD, '{"n": 2}')
        assert woken(clean_redis, subs) == [0, 2]
        got = handover.take(clean_redis, "h1", lane_keys(FAST) + lane_keys(STANDARD), "t",
                            wake=f"{CONSUMER_WAKE_PREFIX}c1")
        assert got.raw == '{"n": 1}'
        assert woken(clean_redis, subs) == [1, 0]


def test_idle_records_are_kept_only_while_renewed(clean_redis):
    """A record older than the keep (its consumer has not taken since) is dropped as
    another is made, and a wake set nobody renews expires."""
    now = clean_redis.time()[0]
    stale = now - handover.IDLE_KEPT_S - 1
    clean_redis.zadd(wake_key(STANDARD), {f"{CONSUMER_WAKE_PREFIX}gone{n}": stale - n
                                          for n in range(100)})
    idle(clean_redis, 0)
    assert clean_redis.zrange(wake_key(STANDARD), 0, -1) == [f"{CONSUMER_WAKE_PREFIX}c0".encode()]
    assert 0 < clean_redis.ttl(wake_key(STANDARD)) <= handover.IDLE_KEPT_S


def test_a_consumer_idle_for_a_while_is_woken_by_a_push(clean_redis):
    """Two consumers of one queue on the transport, both idle: a message sent reaches one
    of them at once (not at its next idle take), and the other stays idle."""
    url = f"gpulanes+{TEST_ENV['GPULANES_BROKER_URL']}"
    queue = Queue("wq", Exchange("wq", type="direct"), "wq")
    got: list[dict] = []
    with Connection(url) as first, Connection(url) as second, Connection(url) as producer:
        for connection in (first, second):
            connection.Consumer(queue, callbacks=[lambda body, m: (got.append(body), m.ack())],
                                accept=["json"]).consume()
            with suppress(TimeoutError):
                connection.drain_events(timeout=0.3)  # its take finds nothing: idle
        assert clean_redis.zcard(wake_key("wq")) == 2
        producer.Producer().publish({"n": 1}, exchange=queue.exchange, routing_key="wq",
                                    declare=[queue])
        assert clean_redis.zcard(wake_key("wq")) == 1
        started = time.monotonic()
        for connection in (second, first):  # the latest idle is woken
            with suppress(TimeoutError):
                connection.drain_events(timeout=1.0)
            if got:
                break
        assert got == [{"n": 1}] and time.monotonic() - started < IDLE_TAKE_S / 2
