"""Predictions: the record of each submitted job that says whose it is, written by the
publish in the step that pushes the job (``lua/record.lua``), and read by the HTTP
front door, which shows a caller its own predictions only.

A record is kept as long as the job's result (``GPULANES_RESULT_TTL_S``); an account's
list holds its latest ``KEPT_PER_ACCOUNT``, newest first when read.
"""
from __future__ import annotations

import json
import time
from dataclasses import dataclass, replace
from typing import Any, Mapping

import redis

from tasks.broker.keys import due_key, prediction_key, predictions_key
from tasks.broker.publish import Record
from tasks.jobs import events
from tasks.settings import settings

#: Predictions an account's list keeps (its oldest drop out).
KEPT_PER_ACCOUNT = 10_000


@dataclass(frozen=True)
class Prediction:
    """What was asked, by whom, and where it went."""

    id: str
    account: str
    model: str
    tier: str
    input: Mapping[str, Any]
    created_at: float
    cancel_after_at: float | None = None
    #: The lane its job was published to ('' when read from an older record).
    lane: str = ""
    #: Waiting in its account's own line for the plan to let it in.
    parked: bool = False
    #: Where its events are sent (a URL), and which (``tasks.jobs.events``).
    webhook: str | None = None
    webhook_events_filter: tuple[str, ...] | None = None
    #: The API's address as its caller reached it: the URLs of its webhook's bodies.
    api_url: str | None = None
    #: When it entered its lane (its lane clock, 0: not indexed).
    entered: float = 0.0


def record(job_id: str, account: str, model: str, tier: str, inputs: Mapping[str, Any],
           cancel_after_s: float | None = None,
           hook: tuple[str, tuple[str, ...], str | None] | None = None) -> Record:
    """The record the publish writes for a new job (``hook``: its webhook's URL and
    events, checked, and the API's address as its caller reached it)."""
    now = time.time()
    body = {"id": job_id, "account": account, "model": model, "tier": tier,
            "input": dict(inputs), "created_at": round(now, 3),
            "cancel_after_at": None if cancel_after_s is None else round(now + cancel_after_s, 3)}
    if hook is not None:
        body.update(webhook=hook[0], webhook_events_filter=list(hook[1]), api_url=hook[2])
    return Record(prediction_key(job_id), predictions_key(account), json.dumps(body),
                  int(settings.result_ttl_s), KEPT_PER_ACCOUNT,
                  events.hook(hook[1]) if hook is not None else "")


def recorded(written: Record, lane: str, parked: bool = False) -> Prediction:
    """The prediction whose record (:func:`record`) a publish just wrote, to ``lane`` or
    parked, as reading it back would find it."""
    return _made(json.loads(written.json), lane=lane, parked=parked)


def _made(body: dict[str, Any], **fields: Any) -> Prediction:
    """The prediction a record's JSON ``body`` and its other ``fields`` say."""
    if body.get("webhook_events_filter") is not None:
        body["webhook_events_filter"] = tuple(body["webhook_events_filter"])
    return Prediction(**body, **fields)


def owned(client: redis.Redis, account: str, job_id: str) -> Prediction | None:
    """The prediction ``job_id`` if ``account`` made it, else None (absent, or another
    account's: the caller cannot tell which)."""
    if not isinstance(job_id, str) or not 0 < len(job_id) <= 200:
        return None
    found = read(client, job_id)
    return found if found is not None and found.account == account else None


def read(client: redis.Redis, job_id: str) -> Prediction | None:
    """The prediction ``job_id``, whoever made it; None when there is no record."""
    return _prediction(client.hgetall(prediction_key(job_id)))


def listed(client: redis.Redis, account: str, offset: int = 0, limit: int = 20
           ) -> list[Prediction]:
    """``account``'s predictions, newest first, from ``offset``."""
    ids = client.zrevrange(predictions_key(account), offset, offset + limit - 1)
    return [p for p in read_many(client, [_text(i) for i in ids])
            if p is not None and p.account == account]


def read_many(client: redis.Redis, ids: list[str]) -> list[Prediction | None]:
    """:func:`read` of each of ``ids``, in one round trip."""
    if not ids:
        return []
    with client.pipeline(transaction=False) as pipe:
        for job_id in ids:
            pipe.hgetall(prediction_key(job_id))
        return [_prediction(fields) for fields in pipe.execute()]


def position(client: redis.Redis, prediction: Prediction) -> int | None:
    """How many jobs of its lane entered before it (0: it is next), while it waits
    there; None where that is not kept (parked, or the relaxed lane's first level)."""
    return positions(client, [prediction])[0]


def positions(client: redis.Redis, made: list[Prediction]) -> list[int | None]:
    """:func:`position` of each of ``made``, in one round trip."""
    placed = [p for p in made if not p.parked and p.lane and p.entered > 0]
    if not placed:
        return [None] * len(made)
    with client.pipeline(transaction=False) as pipe:
        for prediction in placed:
            pipe.zcount(due_key(prediction.lane), "-inf", f"({prediction.entered!r}")
        counts = dict(zip(map(id, placed), pipe.execute()))
    return [None if id(p) not in counts else int(counts[id(p)]) for p in made]


#: The fields of a record that say where its job waits, as :func:`placed_now` reads them.
WHERE_FIELDS = ("lane", "parked", "entered")


def placed_now(prediction: Prediction, fields: list[Any]) -> Prediction:
    """``prediction`` where its record's :data:`WHERE_FIELDS` (``HMGET``) say it waits
    now; as it was when the record is gone."""
    lane, parked, entered = (None if v is None else _text(v) for v in fields)
    if lane is None:
        return prediction
    return replace(prediction, lane=lane, parked=parked == "1", entered=float(entered or 0))


def _prediction(fields: Mapping[Any, Any]) -> Prediction | None:
    if not fields:
        return None
    fields = {_text(k): _text(v) for k, v in fields.items()}
    try:
        body = json.loads(fields["json"])
        return _made(body, lane=fields.get("lane", ""), parked=fields.get("parked") == "1",
                     entered=float(fields.get("entered") or 0))
    except (KeyError, TypeError, ValueError):
        return None


def _text(value: str | bytes) -> str:
    return value.decode() if isinstance(value, bytes) else value
