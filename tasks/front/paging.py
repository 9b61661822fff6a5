"""Pages of an account's predictions, newest first. A cursor names the last prediction
a page showed, so the next page starts right after it however many were made since
(an offset would show some twice).

With cells (``tasks.broker.cells``) each prediction is listed in its job's cell, by the
time that cell's Redis took it: a page is the cells' next ones merged by that time, then
id, and its cursor names the last one's."""
from __future__ import annotations

import base64
import binascii
import json

import redis
from kombu.utils.encoding import bytes_to_str

from tasks.broker import cells
from tasks.broker.keys import predictions_key
from tasks.front.errors import Refused
from tasks.jobs import predictions
from tasks.jobs.predictions import Prediction

#: Predictions a page holds unless ``limit`` says otherwise, and at most.
DEFAULT_LIMIT = 20
MAX_LIMIT = 100


def cursor_after(job_id: str, created_at: float) -> str:
    """The cursor of the page after the one that ended with this prediction."""
    text = json.dumps({"id": job_id, "at": created_at}, separators=(",", ":"))
    return base64.urlsafe_b64encode(text.encode()).decode().rstrip("=")


def page(account: str, cursor: str | None, limit: int
         ) -> tuple[list[Prediction], str | None]:
    """Up to ``limit`` of ``account``'s predictions after ``cursor``, newest first, and
    the cursor of the page after them (None: this is the last)."""
    places = cells.each()
    if len(places) == 1:
        client = places[0][2]
        found = predictions.listed(client, account, offset_of(client, account, cursor),
                                   limit + 1)
        last = found[limit - 1] if len(found) > limit else None
        return found[:limit], None if last is None else cursor_after(last.id, last.created_at)
    # with cells: each cell's next ones, by the time its Redis listed each, then id
    after = _read(cursor) if cursor else None
    listed = sorted(((at, job_id, n) for n, (_, _, client) in enumerate(places)
                     for at, job_id in _listed_before(client, account, after, limit + 1)),
                    reverse=True)[:limit + 1]
    shown = listed[:limit]
    read: dict[str, Prediction] = {}
    for n, (_, _, client) in enumerate(places):  # each from the list's own cell
        ids = [job_id for _, job_id, listed_in in shown if listed_in == n]
        read.update((p.id, p) for p in predictions.read_many(client, ids) if p is not None)
    found = [read[job_id] for _, job_id, _ in shown
             if job_id in read and read[job_id].account == account]
    return found, cursor_after(shown[-1][1], shown[-1][0]) if len(listed) > limit else None


def _listed_before(client: redis.Redis, account: str, after: dict | None, limit: int
                   ) -> list[tuple[float, str]]:
    """(when listed, id) of up to ``limit`` of ``account``'s predictions in one cell's
    list that come after ``after`` (a cursor's: by that time, then id), newest first."""
    key = predictions_key(account)
    if after is None:
        found = client.zrevrange(key, 0, limit - 1, withscores=True)
        return [(score, bytes_to_str(job_id)) for job_id, score in found]
    at, last = float(after["at"]), after["id"]
    with client.pipeline(transaction=False) as pipe:
        pipe.zrangebyscore(key, at, at)  # listed at that very time: by id
        pipe.zrevrangebyscore(key, f"({at!r}", "-inf", start=0, num=limit, withscores=True)
        tied, older = pipe.execute()
    found = [(at, job_id) for job_id in map(bytes_to_str, tied) if job_id < last]
    found += [(score, bytes_to_str(job_id)) for job_id, score in older]
    return sorted(found, reverse=True)[:limit]


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
