"""What a create request carries: its JSON body, and the headers that shape it
(``Idempotency-Key``, ``Cancel-After``, ``Prefer: wait=N``), each checked with the
header named when it is bad.

The create route reads its request itself, without FastAPI's dependencies and
parameters (its costliest per-request work): the body is read as FastAPI reads a
model's JSON body, with FastAPI's own errors, and :data:`OPENAPI` documents it."""
from __future__ import annotations

import email.message
import inspect
import json
import math
import re
from functools import lru_cache
from typing import Any, Literal

from fastapi import Request
from fastapi.exceptions import RequestValidationError
from pydantic import BaseModel, ConfigDict, Field, ValidationError
from starlette.exceptions import HTTPException

from routing.names import FAST, RELAXED, STANDARD
from tasks.api import CANCEL_AFTER_MAX_S, submit
from tasks.broker.message import BOOKKEEPING, ROUTING
from tasks.front.errors import REFUSAL_SCHEMA, Refused

#: Longest ``Prefer: wait=N`` honoured, in seconds (Replicate's too).
MAX_WAIT_S = 60.0
#: Longest ``Idempotency-Key``, in characters.
MAX_IDEMPOTENCY_CHARS = 256
#: Names ``submit()`` keeps for itself (its keyword-only parameters, a job's bookkeeping):
#: never an input.
RESERVED = frozenset({*ROUTING, *BOOKKEEPING, *(
    name for name, param in inspect.signature(submit).parameters.items()
    if param.kind is inspect.Parameter.KEYWORD_ONLY)})
_DURATION = re.compile(r"\s*(\d+(?:\.\d+)?)\s*(ms|s|m|h|d)?\s*")
_UNIT_S = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0, None: 1.0}
_VISIBLE_ASCII = re.compile(r"[\x21-\x7e]+")


class PredictionRequest(BaseModel):
    """A prediction to make: a model, its input, and the tier to run it in."""

    model_config = ConfigDict(extra="forbid", json_schema_extra={"examples": [
        {"model": "echo", "input": {"text": "hi", "repeat": 2}, "tier": "fast"}]})

    model: str = Field(description="A model of `GET /v1/models`.")
    input: dict[str, Any] = Field(default_factory=dict,
                                  description="The model's input, as its schema says.")
    tier: Literal[FAST, STANDARD, RELAXED] = STANDARD  # type: ignore[valid-type]
    downgradable: bool | None = Field(
        None, description="Whether the job may move down a lane under load (default: "
                          "yes for standard, no for fast).")
    webhook: str | None = Field(
        None, max_length=2048, description="A URL each of its events is POSTed to (the "
        "prediction, signed the Standard Webhooks way); refused if it points into the "
        "cluster's own network.")
    webhook_events_filter: list[Literal["start", "progress", "output", "completed"]] | \
        None = Field(None, min_length=1, description="The events sent to `webhook` "
                     "(default: all; progress at most every 500 ms).")

    def inputs(self) -> dict[str, Any]:
        """The input as ``submit()``'s keywords; a name it keeps for itself is refused."""
        if clash := sorted(set(self.input) & RESERVED):
            raise Refused(422, f"input.{clash[0]}: is not an input of any model (it is "
                          "set by the request or the API key)", f"input.{clash[0]}")
        return self.input


async def body_json(request: Request) -> Any:
    """The body, read as FastAPI reads a model's: parsed when its content type says JSON
    (not JSON: a 422 at ``body``; unreadable: a 400); none, or one of another type, as
    its bytes, for :func:`request_body` to refuse."""
    try:
        raw = await request.body()
        if not raw or not _is_json(request.headers.get("content-type") or ""):
            return raw
        return json.loads(raw)
    except json.JSONDecodeError as exc:
        raise RequestValidationError([{
            "type": "json_invalid", "loc": ("body", exc.pos), "msg": "JSON decode error",
            "input": {}, "ctx": {"error": exc.msg}}]) from exc
    except HTTPException:
        raise  # the body's limit (413)
    except Exception as exc:  # noqa: BLE001  bytes no JSON decoder reads, a body cut off
        raise HTTPException(400, "There was an error parsing the body") from exc


def request_body(found: Any) -> PredictionRequest:
    """The request a body (:func:`body_json`) asks, or a 422 naming the first bad field."""
    if found == b"":
        raise RequestValidationError([{"type": "missing", "loc": ("body",),
                                       "msg": "Field required", "input": None}])
    try:
        return PredictionRequest.model_validate(found, from_attributes=True)
    except ValidationError as exc:
        raise RequestValidationError([{**error, "loc": ("body", *error["loc"])}
                                      for error in exc.errors()]) from exc


@lru_cache(maxsize=64)
def _is_json(content_type: str) -> bool:
    """Whether a ``Content-Type`` says JSON (``application/json``, ``.../x+json``)."""
    if not content_type:
        return False
    message = email.message.Message()
    message["content-type"] = content_type
    subtype = message.get_content_subtype()
    return message.get_content_maintype() == "application" and (
        subtype == "json" or subtype.endswith("+json"))


def _header(name: str, description: str) -> dict[str, Any]:
    return {"name": name, "in": "header", "required": False, "description": description,
            "schema": {"type": "string", "title": name}}


#: The create route's request in its OpenAPI operation: the body and the headers; and
#: its refusal of a bad one.
OPENAPI = {
    "requestBody": {"required": True, "content": {"application/json": {
        "schema": PredictionRequest.model_json_schema()}}},
    "responses": {"422": {"description": "A bad body, input or header: `field` names it.",
                          "content": {"application/json": {"schema": REFUSAL_SCHEMA}}}},
    "parameters": [
        _header("Idempotency-Key", "The same key of the same account within 24 h "
                "answers the first prediction and makes none."),
        _header("Cancel-After", "A prediction still queued after this long never runs: "
                "`90`, `1.5`, `500ms`, `30s`, `5m`, `2h`, up to 7 days."),
        _header("Prefer", f"`wait=N`: answer once done, within N s (at most {MAX_WAIT_S:g})")]}


def cancel_after(raw: str | None) -> float | None:
    """``Cancel-After`` in seconds: ``90``, ``1.5``, ``500ms``, ``30s``, ``5m``, ``2h``."""
    if raw is None:
        return None
    found = _DURATION.fullmatch(raw)
    seconds = float(found[1]) * _UNIT_S[found[2]] if found else math.nan
    if not 0 < seconds <= CANCEL_AFTER_MAX_S:
        raise Refused(422, f"Cancel-After: must be a duration like 30s, 5m or 90 (seconds), "
                      f"above 0 and at most {CANCEL_AFTER_MAX_S:.0f}s; got {raw[:40]!r}",
                      "Cancel-After")
    return seconds


def idempotency_key(raw: str | None) -> str | None:
    """``Idempotency-Key``: visible ASCII, at most :data:`MAX_IDEMPOTENCY_CHARS`."""
    if raw is None:
        return None
    if not _VISIBLE_ASCII.fullmatch(raw) or len(raw) > MAX_IDEMPOTENCY_CHARS:
        raise Refused(422, "Idempotency-Key: must be 1 to "
                      f"{MAX_IDEMPOTENCY_CHARS} visible ASCII characters (a UUID will do)",
                      "Idempotency-Key")
    return raw


def wait_s(prefer: str | None) -> float:
    """Seconds ``Prefer: wait=N`` asks to wait for the result (``wait`` alone: the most),
    capped at :data:`MAX_WAIT_S`; 0 when it asks nothing. Preferences this API does not
    know, or a value it cannot read, are ignored, as RFC 7240 says."""
    for preference in (prefer or "").split(","):
        name, _, value = preference.strip().partition("=")
        if name.strip().lower() != "wait":
            continue
        if not value.strip():
            return MAX_WAIT_S
        try:
            seconds = float(value.strip().strip('"'))
        except ValueError:
            return 0.0
        return min(max(seconds, 0.0), MAX_WAIT_S) if math.isfinite(seconds) else 0.0
    return 0.0
