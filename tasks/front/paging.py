"""Pages of an account's predictions, newest first. A cursor names the last prediction
a page showed, so the next page starts right after it however many were made since
(an offset would show some twice)."""
from __future__ import annotations

import base64
import binascii
import json

import redis

from tasks.broker.keys import predictions_key
from tasks.front.errors import Refused

#: Predictions a page holds unless ``limit`` says otherwise, and at most.
DEFAULT_LIMIT = 20
MAX_LIMIT = 100


def cursor_after(job_id: str, created_at: float) -> str:
    """The cursor of the page after the one that ended with this prediction."""
    text = json.dumps({"id": job_id, "at": created_at}, separators=(",", ":"))
    return base64.urlsafe_b64encode(text.encode()).decode().rstrip("=")


def offset_of(client: redis.Redis, account: str, cursor: str | None) -> int:
    """Where the page ``cursor`` names begins in ``account``'s list (0: the newest).
    A prediction gone from the list since (expired) still places the page, by its time."""
    if not cursor:
        return 0
    after = _read(cursor)
    key = predictions_key(account)
    rank = client.zrevrank(key, after["id"])
    if rank is not None:
        return rank + 1
    return int(client.zcount(key, after["at"], "+inf"))


def _read(cursor: str) -> dict:
    try:
        text = base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4))
        after = json.loads(text)
        if isinstance(after["id"], str) and isinstance(after["at"], (int, float)):
            return after
    except (binascii.Error, ValueError, TypeError, KeyError):
        pass
    raise Refused(422, "cursor: not a cursor this API gave (take `next` of a page as it is)",
                  "cursor")
