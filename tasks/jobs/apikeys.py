"""API keys: each names one account and its plan, and is the only way a caller of the
HTTP API says who it is.

A key is shown once, when it is made (``gl_`` and 43 URL-safe characters, 256 random
bits). Redis keeps only its SHA-256 (``API_KEYS_KEY``: hash -> the key's record), so a
copy of Redis lets nobody call as anyone. A key is named in listings by its id, the
first hex digits of that hash. Revoking one drops its record and announces it on
``API_KEYS_REVOKED_CHANNEL``, for processes that keep keys they have seen.
"""
from __future__ import annotations

import hashlib
import json
import secrets
import threading
import time
from dataclasses import asdict, dataclass
from typing import Any

import redis

from tasks.broker.keys import API_KEYS_KEY, API_KEYS_REVOKED_CHANNEL
from tasks.errors import InvalidJob
from tasks.jobs.plans import DEFAULT_PLAN, plan
from tasks.jobs.schema import check_account

KEY_PREFIX = "gl_"
#: Hex digits of a key's hash that name it in listings and revocations.
ID_CHARS = 12


@dataclass(frozen=True)
class ApiKey:
    """What a key stands for (never the key itself)."""

    id: str
    account: str
    plan: str
    created_at: float


def digest(key: str) -> str:
    return hashlib.sha256(key.encode()).hexdigest()


def create(client: redis.Redis, account: str, plan_name: str = DEFAULT_PLAN) -> tuple[str, ApiKey]:
    """A new key for ``account`` on ``plan_name``: (the key, shown only now; its record)."""
    account, plan_name = check_account(account), plan(plan_name).name
    key = KEY_PREFIX + secrets.token_urlsafe(32)
    hashed = digest(key)
    record = ApiKey(hashed[:ID_CHARS], account, plan_name, round(time.time(), 3))
    client.hset(API_KEYS_KEY, hashed, json.dumps(asdict(record)))
    return key, record


def shaped(key: Any) -> bool:
    """Whether ``key`` can be a key at all (else no lookup is spent on it)."""
    return isinstance(key, str) and key.startswith(KEY_PREFIX) and len(key) <= 200


def lookup(client: redis.Redis, key: Any) -> ApiKey | None:
    """The record of ``key``, or None for anything that is not a live key."""
    if not shaped(key):
        return None
    raw = client.hget(API_KEYS_KEY, digest(key))
    return None if raw is None else ApiKey(**json.loads(raw))


def listed(client: redis.Redis) -> list[ApiKey]:
    """Every live key's record, by account then age."""
    records = [ApiKey(**json.loads(raw)) for raw in client.hvals(API_KEYS_KEY)]
    return sorted(records, key=lambda r: (r.account, r.created_at))


def revoke(client: redis.Redis, key_or_id: str) -> ApiKey:
    """Revoke a key named by itself or by its id; its record. :class:`InvalidJob` naming
    ``key`` when no live key matches (or an id matches several)."""
    text = str(key_or_id).strip()
    if text.startswith(KEY_PREFIX):
        hashed = digest(text)
        raw = client.hget(API_KEYS_KEY, hashed)
        matches = [] if raw is None else [(hashed, raw)]
    else:
        matches = [(h, raw) for h, raw in client.hgetall(API_KEYS_KEY).items()
                   if _text(h).startswith(text.lower()) and len(text) >= 6]
    if len(matches) != 1:
        why = "no live key has that id" if not matches else "that id names several keys"
        raise InvalidJob("key", f"{why}: {text[:ID_CHARS]!r}")
    hashed, raw = matches[0]
    client.hdel(API_KEYS_KEY, hashed)
    client.publish(API_KEYS_REVOKED_CHANNEL, _text(hashed))
    return ApiKey(**json.loads(raw))


def _text(value: str | bytes) -> str:
    return value.decode() if isinstance(value, bytes) else value


class KeyCache:
    """Keys this process has seen, so that a request costs no Redis read for its key,
    and a revoked key refused at once all the same.

    A thread listens on ``API_KEYS_REVOKED_CHANNEL`` and drops each revoked key as it
    is announced. While that subscription is down (Redis away, restarting), a
    revocation could pass unheard: nothing is served from memory then, every lookup
    reads Redis, and the memory is emptied once the subscription is back."""

    def __init__(self, client: redis.Redis, kept_s: float = 300.0) -> None:
        self.client, self.kept_s = client, kept_s
        self._kept: dict[str, tuple[float, ApiKey]] = {}  # hash -> (read at, record)
        self._lock = threading.Lock()
        self.listening = threading.Event()
        self._closed = False
        threading.Thread(target=self._listen, name="gpulanes-key-revocations",
                         daemon=True).start()

    def kept(self, key: Any) -> ApiKey | None:
        """The record of ``key`` from memory, without a Redis read: None when it is not
        kept (then :meth:`lookup` reads Redis)."""
        if not shaped(key) or not self.listening.is_set():
            return None
        with self._lock:
            kept = self._kept.get(digest(key))
        return kept[1] if kept is not None and time.monotonic() - kept[0] < self.kept_s \
            else None

    def lookup(self, key: Any) -> ApiKey | None:
        """The record of ``key`` (as :func:`lookup`), from memory while it may be."""
        if not shaped(key):
            return None
        if (record := self.kept(key)) is not None:
            return record
        hashed, now = digest(key), time.monotonic()
        record = lookup(self.client, key)
        if record is not None and self.listening.is_set():
            with self._lock:
                self._kept[hashed] = (now, record)
        return record

    def close(self) -> None:
        """Stop listening; from now on every lookup reads Redis."""
        self._closed = True
        self.listening.clear()
        with self._lock:
            self._kept.clear()

    def _listen(self) -> None:
        while not self._closed:
            pubsub = self.client.pubsub()
            try:
                pubsub.subscribe(API_KEYS_REVOKED_CHANNEL)
                _confirmed(pubsub)  # from now on no revocation passes unheard
                with self._lock:
                    self._kept.clear()  # what was revoked while not listening is unknown
                self.listening.set()
                while not self._closed:
                    message = pubsub.get_message(timeout=1.0)
                    if message is not None and message["type"] == "message":
                        with self._lock:
                            self._kept.pop(_text(message["data"]), None)
            except Exception:  # noqa: BLE001  Redis away: read it for every lookup meanwhile
                self.listening.clear()
                time.sleep(0.5)
            finally:
                pubsub.close()


def _confirmed(pubsub: Any, timeout_s: float = 5.0) -> None:
    """Wait until Redis confirms the subscription (else raise ``TimeoutError``)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        message = pubsub.get_message(timeout=0.5)
        if message is not None and message["type"] == "subscribe":
            return
    raise TimeoutError("no subscription confirmed")
