"""Whether the primary a write was confirmed on is still the one the Sentinels keep.

``WAIT`` (``tasks.broker.scripts.replicated``) makes a replica hold a write, but not
necessarily the replica the Sentinels promote. A primary frozen past
``down-after-milliseconds`` can wake up after they promoted another replica and
before they moved the rest to it: a replica still attached to it acknowledges its
writes, and then drops them when it follows the new primary. So while the Sentinels
fail the master over, or have said anything about it in the last :data:`CALM_S`
seconds (or this process does not hear them), a confirmed write counts only if a
majority of the Sentinels answer, each names the server written to, and none sees it
down or failing over. The rest of the time the check costs nothing: each process
listens to one Sentinel's events from a thread of its own.

On ``+switch-master`` every pool of the process (:func:`follow`) asks the Sentinels
for the primary at once: a client that only reads (the exporter, ``lanes status``)
would otherwise go on reading the old primary, demoted to a replica.
"""
from __future__ import annotations

import logging
import socket
import threading
import time
import weakref

import redis
from redis.sentinel import Sentinel, SentinelConnectionPool

log = logging.getLogger(__name__)

#: Seconds after the Sentinels' last word about the master (or since this process began
#: to listen) during which confirmed writes are checked with every Sentinel.
CALM_S = 5.0
#: A Sentinel flag on the master that means it may be replaced under its writers.
UNSETTLED = frozenset({"s_down", "o_down", "failover_in_progress"})


class Watch:
    """One process's ear on the Sentinels of ``service``."""

    def __init__(self, sentinel: Sentinel, service: str) -> None:
        self.sentinel, self.service = sentinel, service
        self.last_word = 0.0  # monotonic: the last event about the master, or the subscription
        self.listening = False
        self.pools: weakref.WeakSet[SentinelConnectionPool] = weakref.WeakSet()
        threading.Thread(target=self._listen, name="gpulanes-sentinel-watch",
                         daemon=True).start()

    def calm(self) -> bool:
        """Whether this process hears the Sentinels and they said nothing of the master
        for :data:`CALM_S` seconds."""
        return self.listening and time.monotonic() - self.last_word > CALM_S

    def keeps(self, address: tuple[str, int] | None) -> bool:
        """Whether a write confirmed on the primary at ``address`` stands."""
        if self.calm():
            return True
        if address is None:
            return False
        answers = []
        for node in self.sentinel.sentinels:
            try:
                answers.append(node.sentinel_master(self.service))
            except Exception:  # noqa: BLE001  no answer (its owner may close it meanwhile)
                continue
        if 2 * len(answers) <= len(self.sentinel.sentinels):
            return False
        return all((state["ip"], int(state["port"])) == (address[0], int(address[1]))
                   and not UNSETTLED & _flags(state) for state in answers)

    def _listen(self) -> None:
        turn = 0
        while True:
            node = self.sentinel.sentinels[turn % len(self.sentinel.sentinels)]
            turn += 1
            try:
                self._hear(node)
            except Exception as exc:  # noqa: BLE001  deaf now: checked until heard again
                log.debug("sentinel events: %s", exc)
            finally:
                self.listening = False
            time.sleep(0.2)

    def _hear(self, node: redis.Redis) -> None:
        # a client of its own: a pool's owner (kombu) closes the node's connections at will
        kwargs = node.connection_pool.connection_kwargs
        own = redis.Redis(host=kwargs.get("host"), port=kwargs.get("port"),
                          password=kwargs.get("password"), username=kwargs.get("username"),
                          socket_timeout=5.0, socket_connect_timeout=5.0)
        with own, own.pubsub() as pubsub:
            pubsub.psubscribe("*")
            while True:
                message = pubsub.get_message(timeout=1.0)
                if message is None:
                    pubsub.ping()  # a Sentinel gone silent is noticed within its timeout
                    continue
                if message["type"] == "psubscribe":
                    self.last_word, self.listening = time.monotonic(), True
                elif message["type"] == "pmessage" and self._about_master(message["data"]):
                    self.last_word = time.monotonic()
                    if _text(message["channel"]) == "+switch-master":
                        *_, host, port = _text(message["data"]).split()
                        threading.Thread(target=self._switch, args=((host, int(port)),),
                                         daemon=True).start()

    def _switch(self, new: tuple[str, int], timeout_s: float = 10.0) -> None:
        """Point every pool at the ``new`` primary, asking until the Sentinel each asks
        has heard of the switch too: idle connections to the old one are closed, and a
        connection in use there (a worker's BRPOP) is shut down under its user, who
        meets a broken connection and connects again."""
        deadline = time.monotonic() + timeout_s
        pools = list(self.pools)
        while pools and time.monotonic() < deadline:
            for pool in list(pools):
                try:
                    if tuple(pool.get_master_address()) == new:
                        pools.remove(pool)
                        _cut_in_use(pool, new)
                except (redis.RedisError, OSError, TypeError) as exc:
                    log.debug("sentinel switch: %s", exc)
            time.sleep(0.2)

    def _about_master(self, data: bytes | str) -> bool:
        return f" {self.service} " in f" {_text(data)} "


def _cut_in_use(pool: SentinelConnectionPool, new: tuple[str, int]) -> None:
    for connection in getattr(pool, "_get_in_use_connections", set)():
        sock = getattr(connection, "_sock", None)
        if sock is not None and (connection.host, int(connection.port)) != new:
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass  # closed meanwhile


def _text(value: bytes | str) -> str:
    return value.decode(errors="replace") if isinstance(value, bytes) else str(value)


def _flags(state: dict) -> set[str]:
    flags = state.get("flags", "")
    return set(flags.split(",")) if isinstance(flags, str) else set(flags)


_lock = threading.Lock()
_watches: dict[tuple, Watch] = {}


def watch(pool: SentinelConnectionPool) -> Watch:
    """The watch of the Sentinels behind ``pool``, one per process and topology."""
    sentinel = pool.sentinel_manager
    key = (pool.service_name, *sorted(
        (node.connection_pool.connection_kwargs.get("host"),
         node.connection_pool.connection_kwargs.get("port")) for node in sentinel.sentinels))
    with _lock:
        if key not in _watches:
            _watches[key] = Watch(sentinel, pool.service_name)
        return _watches[key]


def follow(pool: SentinelConnectionPool) -> SentinelConnectionPool:
    """Have ``pool`` ask the Sentinels for the primary as soon as they switch it."""
    watch(pool).pools.add(pool)
    return pool


def stands(pool: object) -> bool:
    """Whether a write confirmed through ``pool`` stands (always, without Sentinel)."""
    if not isinstance(pool, SentinelConnectionPool):
        return True
    return watch(pool).keeps(pool.master_address)
