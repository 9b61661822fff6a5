"""The HTTP clients of ``benchmarks/api.py``'s throughput rounds, on asyncio: each slot
of a client process keeps one request in flight to its API server, with its share of
the keys. Two ways to send: httpx's ``AsyncClient`` (keep-alive), or *raw*: one
keep-alive HTTP/1.1 connection per slot, each request's bytes written beforehand and
each answer read by its ``Content-Length``, so that a client costs the machine's cores
as little as it can."""
from __future__ import annotations

import asyncio
import json
import re
from typing import Any
from urllib.parse import urlsplit

from benchmarks.common import PROMPT

#: The job every POST asks for: a class model that needs no weights, the default tier.
BODY = {"model": "echo", "input": {"text": PROMPT}, "tier": "standard"}
CREATE_PATH = "/v1/predictions"
#: An authenticated call that reads nothing from Redis (every model's input schema).
MODELS_PATH = "/v1/models"
#: How a client process sends: raw (the default) or httpx.
SENDERS = ("raw", "httpx")
_LENGTH = re.compile(rb"(?i)\r\ncontent-length:\s*(\d+)")
_CLOSE = re.compile(rb"(?i)\r\nconnection:\s*close")

#: One slot: its server's URL and its keys.
End = tuple[str, list[str]]


def request(method: str, url: str, path: str, key: str, body: bytes = b"") -> bytes:
    """An HTTP/1.1 request's bytes, keep-alive, authorised by ``key``."""
    head = [f"{method} {path} HTTP/1.1", f"Host: {urlsplit(url).netloc}",
            f"Authorization: Bearer {key}"]
    if body:
        head += ["Content-Type: application/json", f"Content-Length: {len(body)}"]
    return ("\r\n".join(head) + "\r\n\r\n").encode() + body


def answer_status(head: bytes) -> tuple[int, int, bool]:
    """An answer's head (up to its blank line): its status, body length, whether the
    server closes the connection after it."""
    found = _LENGTH.search(head)
    return int(head[9:12]), int(found[1]) if found else 0, bool(_CLOSE.search(head))


class Wire:
    """One keep-alive connection to ``url``."""

    def __init__(self, url: str) -> None:
        self.url, self.reader, self.writer = url, None, None

    async def call(self, raw: bytes) -> int:
        """Send ``raw``, read the whole answer; its status. A connection the server
        closed, or one an error left in doubt, is opened anew on the next call."""
        if self.writer is None:
            parts = urlsplit(self.url)
            self.reader, self.writer = await asyncio.open_connection(parts.hostname,
                                                                     parts.port)
        try:
            self.writer.write(raw)
            status, length, close = answer_status(await self.reader.readuntil(b"\r\n\r\n"))
            await self.reader.readexactly(length)
        except BaseException:
            self.close()
            raise
        if close:
            self.close()
        return status

    def close(self) -> None:
        if self.writer is not None:
            self.writer.close()
        self.reader = self.writer = None


class Raw:
    """A wire per slot, its requests' bytes made beforehand."""

    def __init__(self, concurrency: int) -> None:
        self.wires: list[Wire] = []
        self.posts: list[list[bytes]] = []

    async def ready(self, ends: list[End]) -> None:
        """Fresh connections (a server drops idle ones), each tried once."""
        await self.close()
        body = json.dumps(BODY).encode()
        self.wires = [Wire(url) for url, _ in ends]
        self.posts = [[request("POST", url, CREATE_PATH, key, body) for key in keys]
                      for url, keys in ends]
        await asyncio.gather(*(wire.call(request("GET", url, MODELS_PATH, keys[0]))
                               for wire, (url, keys) in zip(self.wires, ends)))

    async def post(self, slot: int, i: int) -> int:
        posts = self.posts[slot]
        return await self.wires[slot].call(posts[i % len(posts)])

    async def close(self) -> None:
        for wire in self.wires:
            wire.close()


class Httpx:
    """One ``httpx.AsyncClient`` of ``concurrency`` keep-alive connections."""

    def __init__(self, concurrency: int) -> None:
        import httpx

        self.http = httpx.AsyncClient(timeout=60, limits=httpx.Limits(
            max_connections=concurrency, max_keepalive_connections=concurrency))
        self.ends: list[tuple[str, list[dict[str, str]]]] = []

    async def ready(self, ends: list[End]) -> None:
        """Every slot's connection opened (or found open) by a call."""
        self.ends = [(url, [{"Authorization": f"Bearer {key}"} for key in keys])
                     for url, keys in ends]
        await asyncio.gather(*(self.http.get(url + MODELS_PATH, headers=auths[0])
                               for url, auths in self.ends))

    async def post(self, slot: int, i: int) -> int:
        url, auths = self.ends[slot]
        made = await self.http.post(url + CREATE_PATH, json=BODY, headers=auths[i % len(auths)])
        return made.status_code

    async def close(self) -> None:
        await self.http.aclose()


def sender(how: str, concurrency: int) -> Raw | Httpx:
    """A client process's way to send (one of :data:`SENDERS`)."""
    return {"raw": Raw, "httpx": Httpx}[how](concurrency)


async def posted(sending: Any, slots: int, seconds: float) -> dict[str, Any]:
    """Each of ``slots`` POSTs one prediction after another for ``seconds``; the answers
    by status (or error)."""
    import time
    from collections import Counter

    statuses: Counter = Counter()
    deadline = time.perf_counter() + seconds

    async def one_slot(slot: int) -> None:
        sent = 0
        while time.perf_counter() < deadline:
            try:
                statuses[str(await sending.post(slot, sent))] += 1
            except Exception as exc:  # noqa: BLE001  counted, reported, the load goes on
                statuses[type(exc).__name__] += 1
            sent += 1

    await asyncio.gather(*(one_slot(slot) for slot in range(slots)))
    return dict(statuses)
