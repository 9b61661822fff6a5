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


def lookup(client: redis.Redis, key: Any) -> ApiKey | None:
    """The record of ``key``, or None for anything that is not a live key."""
    if not isinstance(key, str) or not key.startswith(KEY_PREFIX) or len(key) > 200:
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
