"""The pub/sub connection a transport waits on, read by a thread of its own: wake-ups
for the queues it consumes and the messages of the fanout exchanges they are bound to
(``tasks.broker.lanes``)."""
from __future__ import annotations

import queue
import threading
import time
from typing import Any

import redis


class Bus:
    """The pub/sub connection, read by a thread of its own. What it hears, and the
    room an ack makes for a consumer at its prefetch limit, reach :meth:`wait`."""

    def __init__(self, client: redis.Redis) -> None:
        self.pubsub = client.pubsub()  # a confirmed subscription is heard too
        self.heard: queue.SimpleQueue = queue.SimpleQueue()
        self.reader: threading.Thread | None = None
        self.closed = False
        #: Why the connection is down now (None: it reads): raised by :meth:`wait` while
        #: it lasts, never after the reader is back (a connection waited on only now and
        #: then, a producer's, would otherwise meet an outage long over).
        self.failing: Exception | None = None

    def subscribe(self, name: str, on_connect: Any) -> None:
        self.pubsub.subscribe(name)
        if self.reader is None:  # the connection exists now
            self.pubsub.connection.register_connect_callback(on_connect)
            self.reader = threading.Thread(target=self._read, name="gpulanes-bus", daemon=True)
            self.reader.start()

    def _read(self) -> None:
        while not self.closed:
            try:
                message = self.pubsub.get_message(timeout=1.0)
            except Exception as exc:  # noqa: BLE001  the consumer raises it
                if self.closed:
                    return
                self.failing = exc
                self.heard.put(None)  # wake the waiter: it raises while this lasts
                time.sleep(0.5)
                continue
            self.failing = None
            if message is not None:
                self.heard.put(message)

    def nudge(self) -> None:
        """Wake :meth:`wait` with nothing heard (room was made)."""
        self.heard.put(None)

    def wait(self, timeout: float) -> list[dict]:
        """What was heard within ``timeout`` s (at least one thing, or nothing in time);
        raises why the connection is down, while it is."""
        if (failing := self.failing) is not None:
            raise failing
        try:
            got = [self.heard.get(timeout=timeout)]
        except queue.Empty:
            return []
        while True:
            try:
                got.append(self.heard.get_nowait())
            except queue.Empty:
                break
        if (failing := self.failing) is not None:
            raise failing
        return [item for item in got if item is not None]

    def close(self) -> None:
        self.closed = True
        self.pubsub.close()
