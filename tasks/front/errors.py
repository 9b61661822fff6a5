"""What a refused request answers: gpulanes' errors and FastAPI's own validation as
JSON ``{"detail": ..., "field": ...}`` with the status and headers a client acts on."""
from __future__ import annotations

import math
from datetime import datetime, timezone
from typing import Any

import redis
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from kombu.exceptions import OperationalError
from starlette.exceptions import HTTPException

from tasks.errors import (
    BrokerUnavailable,
    FastTimeSpent,
    GpulanesError,
    InvalidJob,
    LaneFull,
    ModelError,
    OverLimit,
)

#: Seconds a client is told to wait when Redis is away or refusing.
UNAVAILABLE_RETRY_S = 5
#: ``submit()``'s names of what came from a header, as the caller wrote them.
HEADER_FIELDS = {"idempotency_key": "Idempotency-Key", "cancel_after": "Cancel-After"}
#: Fields of the request body itself; any other field ``submit()`` names is an input.
BODY_FIELDS = frozenset({"model", "tier", "downgradable", "webhook", "webhook_events_filter"})
#: A refusal's JSON, as the OpenAPI document shows it.
REFUSAL_SCHEMA = {"type": "object", "required": ["detail"], "properties": {
    "detail": {"type": "string", "description": "What was wrong and what to do."},
    "field": {"type": "string", "description": "The bad field: `input.text`, `model`, "
                                                "`Cancel-After`..."}}}
#: Redis errors met outside ``submit()`` (reading a prediction, a key): Redis is away.
REDIS_OUTAGES = (redis.exceptions.ConnectionError, redis.exceptions.TimeoutError,
                 redis.exceptions.ReadOnlyError, OperationalError)


class Refused(HTTPException):
    """A request refused with ``status`` and ``detail`` (401, 404, 413, 422 here). An
    ``HTTPException``: FastAPI lets it through where it meets one reading a body."""

    def __init__(self, status: int, detail: str, field: str | None = None,
                 headers: dict[str, str] | None = None) -> None:
        super().__init__(status, detail, headers)
        self.field = field


def answer(status: int, detail: str, headers: dict[str, str] | None = None,
           **extra: Any) -> JSONResponse:
    """A JSON error: ``{"detail": ..., **extra}``."""
    return JSONResponse({"detail": detail, **extra}, status_code=status, headers=headers)


def retry_after(seconds: float) -> dict[str, str]:
    """A ``Retry-After`` header of whole seconds, at least one."""
    return {"Retry-After": str(max(1, math.ceil(seconds)))}


def request_field(field: str) -> str:
    """Where a field ``submit()`` named sits in the request: a header, a body field, or
    ``input.<name>``."""
    if field in HEADER_FIELDS:
        return HEADER_FIELDS[field]
    if field in BODY_FIELDS:
        return field
    return "input" if field == "inputs" else f"input.{field}"


def iso(epoch_s: float) -> str:
    """A Unix time as ISO 8601 in UTC, to the millisecond."""
    return datetime.fromtimestamp(epoch_s, timezone.utc).isoformat(timespec="milliseconds")


async def _refused(request: Request, exc: Refused) -> JSONResponse:
    extra = {} if exc.field is None else {"field": exc.field}
    return answer(exc.status_code, exc.detail, exc.headers, **extra)


async def _invalid_job(request: Request, exc: InvalidJob) -> JSONResponse:
    return answer(422, str(exc), field=request_field(exc.field))


async def _invalid_request(request: Request, exc: RequestValidationError) -> JSONResponse:
    first = exc.errors()[0] if exc.errors() else {"loc": (), "msg": "invalid request"}
    if first.get("type") == "json_invalid":  # its place is a character offset, no field
        return answer(422, f"body: not JSON ({first.get('ctx', {}).get('error', 'invalid')} "
                      f"at character {first['loc'][-1]})", field="body")
    where = [str(part) for part in first.get("loc", ())]
    if where and where[0] in ("body", "query", "path", "header"):
        where = where[1:]
    field = ".".join(where) or "body"
    return answer(422, f"{field}: {first.get('msg', 'invalid')}", field=field)


async def _over_limit(request: Request, exc: OverLimit) -> JSONResponse:
    return answer(429, str(exc), retry_after(exc.retry_after_s), limit=exc.limit)


async def _fast_time_spent(request: Request, exc: FastTimeSpent) -> JSONResponse:
    return answer(402, str(exc), renews_at=iso(exc.renews_at), renews_at_unix=exc.renews_at)


async def _lane_full(request: Request, exc: LaneFull) -> JSONResponse:
    return answer(503, str(exc), retry_after(exc.retry_after_s), lane=exc.lane)


async def _unavailable(request: Request, exc: BrokerUnavailable) -> JSONResponse:
    return answer(503, str(exc), retry_after(UNAVAILABLE_RETRY_S))


async def _redis_away(request: Request, exc: Exception) -> JSONResponse:
    from tasks.api import unavailable  # says what Redis said, as submit() does

    return await _unavailable(request, unavailable(exc))


async def _model_error(request: Request, exc: ModelError) -> JSONResponse:
    return answer(503, f"the model cannot be used now: {exc}")


async def _other(request: Request, exc: GpulanesError) -> JSONResponse:
    return answer(500, f"{type(exc).__name__}: {exc}")


def install(app: FastAPI) -> None:
    """Answer each of these errors, wherever a request meets it, as said above."""
    handlers = [(Refused, _refused), (InvalidJob, _invalid_job),
                (RequestValidationError, _invalid_request), (OverLimit, _over_limit),
                (FastTimeSpent, _fast_time_spent), (LaneFull, _lane_full),
                (BrokerUnavailable, _unavailable), (ModelError, _model_error),
                (GpulanesError, _other), *((kind, _redis_away) for kind in REDIS_OUTAGES)]
    for kind, handler in handlers:
        app.add_exception_handler(kind, handler)
