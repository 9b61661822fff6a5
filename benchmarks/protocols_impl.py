"""The queue protocols ``benchmarks/protocols.py`` sets side by side, and its processes.

Each protocol is written minimally but correctly: ``publish``, ``take`` (the hand-over),
``ack``, ``located`` (the job ids Redis still holds in a lane or under a holder record)
and ``recover`` (what maintenance does for a dead worker). Lanes are read in priority
order: fast, standard, relaxed. A message body is small JSON: ``id``, ``lane``, ``t``
(publish time) and ``probe`` (the fast job sent behind a backlog).
"""
from __future__ import annotations

import base64
import json
import os
import time
from typing import Any, Iterable

import redis

LANES = ("fast", "standard", "relaxed")
#: the lanes' kombu queues (k, g), not named as gpulanes' lanes: its transport may send
#: a lane's publish through admission (``tasks.broker.publish``), not measured here
QUEUES = tuple(f"bench-{lane}" for lane in LANES)
#: idle backoff of the polling protocol (a): first and longest sleep, seconds
IDLE_FIRST_S, IDLE_MAX_S = 0.001, 0.02
#: how long a blocking take waits before it looks at the lanes again, seconds
BLOCK_S = 0.05
HEARTBEAT_S = 1.0

TAKE_LUA = """
local n = #KEYS - 2
for i = 1, n do
  local id = redis.call('RPOP', KEYS[i])
  if id then
    redis.call('ZADD', KEYS[n + 1], ARGV[1], id)
    return {id, redis.call('HGET', KEYS[n + 2], id)}
  end
end
return false
"""
ENQUEUE_LUA = "redis.call('HSET', KEYS[2], ARGV[1], ARGV[2]) redis.call('LPUSH', KEYS[1], ARGV[1])"
ACK_LUA = "redis.call('ZREM', KEYS[1], ARGV[1]) redis.call('HDEL', KEYS[2], ARGV[1])"
#: a dead worker's ack set back to the heads of its messages' lanes
REQUEUE_LUA = """
local ids = redis.call('ZRANGE', KEYS[1], 0, -1)
for _, id in ipairs(ids) do
  local lane = cjson.decode(redis.call('HGET', KEYS[2], id)).lane
  redis.call('RPUSH', 'a:' .. lane, id)
end
redis.call('DEL', KEYS[1])
redis.call('HDEL', KEYS[3], ARGV[1])
return #ids
"""


def body_of(job_id: str, lane: str, probe: bool = False) -> str:
    """A job's message body."""
    return json.dumps({"id": job_id, "lane": lane, "t": time.time(), "probe": probe,
                       "args": {"prompt": "a lighthouse in a storm", "steps": 4}})


class Protocol:
    """One worker process' (or producer's) connection to a protocol."""

    name = ""

    def __init__(self, sock: str, worker: str) -> None:
        self.r = redis.Redis(unix_socket_path=sock, decode_responses=True)
        self.sock, self.worker = sock, worker

    def setup(self) -> None:
        """Create what must exist before the first publish."""

    def publish_many(self, items: Iterable[tuple[str, str, str]]) -> None:
        """Publish (lane, id, body) items, one round trip each."""
        for lane, job_id, body in items:
            self.publish(lane, job_id, body)

    def publish(self, lane: str, job_id: str, body: str) -> None:
        raise NotImplementedError

    def take(self) -> list[tuple[Any, str]]:
        """(handle, body) of what this worker now holds; [] after a short wait."""
        raise NotImplementedError

    def ack(self, handle: Any) -> None:
        raise NotImplementedError

    def located(self) -> set[str]:
        """Ids in a lane or under a holder record."""
        raise NotImplementedError

    def recover(self, dead: str) -> int | None:
        """Hand a dead worker's messages on; how many."""
        raise NotImplementedError


class AckSets(Protocol):
    """(a) dramatiq-style: Lua pops by priority and adds the id to the worker's ack ZSET."""

    name = "a: Lua + ack set"

    def __init__(self, sock: str, worker: str) -> None:
        super().__init__(sock, worker)
        script = self.r.register_script
        self.enqueue, self.pop = script(ENQUEUE_LUA), script(TAKE_LUA)
        self.done, self.requeue = script(ACK_LUA), script(REQUEUE_LUA)
        self.keys = [f"a:{lane}" for lane in LANES] + [f"a:ack:{worker}", "a:msgs"]
        self.beat_at, self.idle_s = 0.0, IDLE_FIRST_S

    def publish(self, lane: str, job_id: str, body: str) -> None:
        self.enqueue(keys=[f"a:{lane}", "a:msgs"], args=[job_id, body])

    def take(self) -> list[tuple[Any, str]]:
        now = time.time()
        if now - self.beat_at > HEARTBEAT_S:  #: the heartbeat keeps this worker alive
            self.r.hset("a:heartbeats", self.worker, now)
            self.beat_at = now
        got = self.pop(keys=self.keys, args=[now])
        if got:
            self.idle_s = IDLE_FIRST_S
            return [(got[0], got[1])]
        time.sleep(self.idle_s)
        self.idle_s = min(IDLE_MAX_S, self.idle_s * 2)
        return []

    def ack(self, handle: Any) -> None:
        self.done(keys=[f"a:ack:{self.worker}", "a:msgs"], args=[handle])

    def located(self) -> set[str]:
        found = {i for lane in LANES for i in self.r.lrange(f"a:{lane}", 0, -1)}
        return found | {i for key in self.r.keys("a:ack:*") for i in self.r.zrange(key, 0, -1)}

    def recover(self, dead: str) -> int:
        return self.requeue(keys=[f"a:ack:{dead}", "a:msgs", "a:heartbeats"], args=[dead])


class Processing(Protocol):
    """(b) rq-style: LMOVE per lane into the worker's processing list, then BLMOVE."""

    name = "b: LMOVE/BLMOVE"

    def publish(self, lane: str, job_id: str, body: str) -> None:
        self.r.lpush(f"b:{lane}", body)

    def take(self) -> list[tuple[Any, str]]:
        mine = f"b:proc:{self.worker}"
        for lane in LANES:
            body = self.r.lmove(f"b:{lane}", mine, "RIGHT", "LEFT")
            if body:
                return [(body, body)]
        body = self.r.blmove(f"b:{LANES[0]}", mine, BLOCK_S, "RIGHT", "LEFT")
        return [(body, body)] if body else []

    def ack(self, handle: Any) -> None:
        self.r.lrem(f"b:proc:{self.worker}", 1, handle)

    def located(self) -> set[str]:
        keys = [f"b:{lane}" for lane in LANES] + self.r.keys("b:proc:*")
        return {json.loads(body)["id"] for key in keys for body in self.r.lrange(key, 0, -1)}

    def recover(self, dead: str) -> int:
        moved, mine = 0, f"b:proc:{dead}"
        while (body := self.r.lindex(mine, -1)) is not None:
            self.r.lmove(mine, f"b:{json.loads(body)['lane']}", "RIGHT", "RIGHT")
            moved += 1
        return moved


def stream_id(raw: str) -> tuple[int, int]:
    """``"1700-3"`` -> ``(1700, 3)``: stream ids in order."""
    ms, _, seq = raw.partition("-")
    return int(ms), int(seq)


class Streams(Protocol):
    """(c) one stream per lane, one consumer group: XREADGROUP, XACK (+XDEL), XAUTOCLAIM."""

    name = "c: Streams"

    def setup(self) -> None:
        for lane in LANES:
            self.r.xgroup_create(f"c:{lane}", "g", id="0", mkstream=True)

    def publish(self, lane: str, job_id: str, body: str) -> None:
        self.r.xadd(f"c:{lane}", {"b": body})

    def take(self) -> list[tuple[Any, str]]:
        for lane in LANES:
            got = self.r.xreadgroup("g", self.worker, {f"c:{lane}": ">"}, count=1)
            if got:
                return self.entries(got)
        got = self.r.xreadgroup("g", self.worker, {f"c:{lane}": ">" for lane in LANES},
                                count=1, block=int(BLOCK_S * 1000))
        return self.entries(got or [])

    @staticmethod
    def entries(got: list) -> list[tuple[Any, str]]:
        """Every entry of an XREADGROUP reply, in lane order (all are in the PEL)."""
        return [((stream, sid), fields["b"]) for stream, items in
                sorted(got, key=lambda s: LANES.index(s[0][2:])) for sid, fields in items]

    def ack(self, handle: Any) -> None:
        stream, sid = handle
        self.r.pipeline(transaction=False).xack(stream, "g", sid).xdel(stream, sid).execute()

    def located(self) -> set[str]:
        found = set()
        for lane in LANES:
            stream = f"c:{lane}"
            last = stream_id(self.r.xinfo_groups(stream)[0]["last-delivered-id"])
            pending = {p["message_id"]
                       for p in self.r.xpending_range(stream, "g", "-", "+", 10 ** 6)}
            found |= {json.loads(fields["b"])["id"] for sid, fields in self.r.xrange(stream)
                      if sid in pending or stream_id(sid) > last}
        return found

    def recover(self, dead: str) -> int:
        return sum(len(self.r.xautoclaim(f"c:{lane}", "g", "recovery", 0, "0-0", count=10 ** 6)[1])
                   for lane in LANES)


class Kombu(Protocol):
    """(k) kombu's stock Redis transport: BRPOP, then a pipeline records it as unacked."""

    name = "k: kombu (BRPOP)"
    url, options = "redis+socket://", {"queue_order_strategy": "priority"}

    def __init__(self, sock: str, worker: str, **options: Any) -> None:
        from kombu import Connection, Exchange, Queue
        from kombu import Consumer as KombuConsumer

        super().__init__(sock, worker)
        self.conn = Connection(self.url + sock, transport_options={**self.options, **options})
        self.queues = [Queue(name, Exchange(name, "direct"), routing_key=name) for name in QUEUES]
        self.producer, self.consumer, self.held = None, None, []
        self.Consumer = KombuConsumer

    def publish(self, lane: str, job_id: str, body: str) -> None:
        if self.producer is None:
            self.producer = self.conn.Producer(serializer="json")
            for queue in self.queues:
                queue(self.producer.channel).declare()
        queue = self.queues[LANES.index(lane)]
        self.producer.publish(json.loads(body), exchange=queue.exchange,
                              routing_key=queue.routing_key)

    def take(self) -> list[tuple[Any, str]]:
        import socket

        if self.consumer is None:  # a Celery worker's consumer: prefetch 1, late ack
            channel = self.conn.channel()
            channel.basic_qos(0, 1, False)
            self.consumer = self.Consumer(channel, self.queues, accept=["json"],
                                               callbacks=[self.hold])
            self.consumer.consume()
        try:
            self.conn.drain_events(timeout=BLOCK_S)
        except socket.timeout:
            pass
        held, self.held = self.held, []
        return held

    def hold(self, body: Any, message: Any) -> None:
        self.held.append((message, json.dumps(body)))

    def ack(self, handle: Any) -> None:
        handle.ack()

    def located(self) -> set[str]:
        entries = [e for name in QUEUES for e in self.r.lrange(name, 0, -1)]
        entries += [json.dumps(json.loads(v)[0]) for v in self.r.hvals("unacked")]
        return {kombu_id(entry) for entry in entries}

    def recover(self, dead: str) -> int:
        before = self.r.hlen("unacked")
        with Kombu(self.sock, "recovery", visibility_timeout=0) as rescuer:
            rescuer.conn.channel().qos.restore_visible(num=10 ** 6)
        return before - self.r.hlen("unacked")

    def __enter__(self) -> "Kombu":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.conn.release()


class Lanes(Kombu):
    """(g) gpulanes' transport, used as (k) is: one Lua step moves the message into this
    process's records (``gpulanes:held:<holder>``); idle consumers wait on pub/sub."""

    name = "g: gpulanes (hand-over)"
    url, options = "gpulanes+redis+socket://", {}

    def __init__(self, sock: str, worker: str, **options: Any) -> None:
        import tasks.broker.lanes  # noqa: F401  registers the transport

        super().__init__(sock, worker, **options)

    def take(self) -> list[tuple[Any, str]]:
        if self.consumer is None:  # as a worker does: its name is its takes' holder
            from tasks.broker.holder import set_holder

            set_holder(self.worker)
        return super().take()

    def located(self) -> set[str]:
        from tasks.broker.keys import HELD_PREFIX

        entries = [e for name in QUEUES for e in self.r.lrange(name, 0, -1)]
        entries += [record.partition("\n")[2] for key in self.r.keys(HELD_PREFIX + "*")
                    for record in self.r.hvals(key)]
        return {kombu_id(entry) for entry in entries}

    def recover(self, dead: str) -> int:
        from tasks.broker.handover import put_back_all

        return put_back_all(self.r, dead)


def kombu_id(entry: str) -> str:
    """Our job id inside a kombu message (its body base64-encoded JSON)."""
    message = json.loads(entry)
    body = message["body"]
    if message.get("properties", {}).get("body_encoding") == "base64":
        body = base64.b64decode(body)
    return json.loads(body)["id"]


PROTOCOLS = {"a": AckSets, "b": Processing, "c": Streams, "k": Kombu, "g": Lanes}


# --- the processes ---------------------------------------------------------------
def produce(key: str, sock: str, name: str, jobs: list[str], ready: Any, go: Any) -> None:
    """Publish ``jobs`` (ids ``<lane>-<n>``) one round trip each, once ``go`` is set."""
    proto = PROTOCOLS[key](sock, name)
    with ready.get_lock():
        ready.value += 1
    go.wait()
    proto.publish_many((job.split("-")[0], job, body_of(job, job.split("-")[0])) for job in jobs)


def consume(key: str, sock: str, name: str, done_path: str, shared: dict[str, Any],
            results: Any) -> None:
    """Take, "run" (``work_ms``), record the id in ``done_path``, ack; until ``stop``.

    The id is written before the ack: a kill between the two leaves a held message,
    never a done one counted as lost. Take-to-ack seconds go to ``results`` at the end;
    a probe's wait (publish to take) at once.
    """
    proto = PROTOCOLS[key](sock, name)
    fd = os.open(done_path, os.O_WRONLY | os.O_APPEND | os.O_CREAT)
    with shared["ready"].get_lock():
        shared["ready"].value += 1
    shared["go"].wait()
    latencies = []
    while not shared["stop"].is_set():
        for handle, body in proto.take():
            taken, message = time.perf_counter(), json.loads(body)
            if message["probe"]:
                results.put(("probe", time.time() - message["t"]))
            if shared["work_ms"].value:
                time.sleep(shared["work_ms"].value / 1000)
            os.write(fd, f"{message['id']}\n".encode())
            proto.ack(handle)
            latencies.append(time.perf_counter() - taken)
            with shared["done"].get_lock():
                shared["done"].value += 1
    results.put(("latency", latencies))
