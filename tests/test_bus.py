"""The transport's pub/sub reader (``tasks.broker.bus``) on a Redis killed and started
again: an outage is raised while it lasts, and never after the reader is back."""
from __future__ import annotations

import time

import pytest
import redis

from gpu_worker.redis_server import EmbeddedRedis
from tasks.broker.bus import Bus


def _until(check, timeout_s: float = 15.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not check():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.05)


def _messages(bus: Bus) -> list[dict]:
    """What was published (a confirmed subscription is heard too, as a wake-up)."""
    return [m for m in bus.wait(0.2) if m["type"] == "message"]


class Reconnects:
    def __init__(self) -> None:
        self.count = 0

    def seen(self, *_: object) -> None:  # a bound method: redis-py keeps a weak reference
        self.count += 1


def test_an_outage_is_raised_while_it_lasts_and_never_after(tmp_path):
    server = EmbeddedRedis(tmp_path / "redis").start()
    client = redis.Redis(unix_socket_path=str(server.socket), socket_timeout=2)
    bus = Bus(client)
    try:
        bus.subscribe("wake", Reconnects().seen)
        _until(lambda: bus.wait(0.2))  # the subscription confirmed
        client.publish("wake", "1")
        _until(lambda: _messages(bus))
        server.kill()
        with pytest.raises(redis.ConnectionError):
            deadline = time.monotonic() + 15
            while time.monotonic() < deadline:
                bus.wait(0.2)
        server.start()
        _until(lambda: bus.failing is None)  # the reader is back and subscribed again
        time.sleep(1.5)  # what it met during the outage is not raised now
        assert _messages(bus) == []
        client.publish("wake", "2")
        _until(lambda: _messages(bus))
    finally:
        bus.close()
        server.kill()
