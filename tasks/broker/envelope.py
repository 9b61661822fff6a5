"""kombu's message envelope on Redis, read and rewritten in one place.

A lane list holds JSON objects as kombu's Redis transport writes them: ``body``
(base64 of the JSON ``[args, kwargs, embed]`` Celery sends), ``headers`` (``id``:
the job id, ``task``...) and ``properties`` (``delivery_tag``, ``delivery_info``,
``priority``, ``body_encoding``). Every rewrite here returns a new envelope:
nothing edits a message in place.
"""
from __future__ import annotations

import base64
import json
from typing import Any

Envelope = dict[str, Any]


def decode(raw: bytes | str) -> Envelope:
    """The envelope stored as ``raw`` (raises ``ValueError`` if it is not JSON)."""
    return json.loads(raw)


def encode(envelope: Envelope) -> str:
    return json.dumps(envelope)


def job_id(envelope: Any) -> str:
    """The job id in an envelope's headers; '' when there is none."""
    headers = envelope.get("headers") if isinstance(envelope, dict) else None
    found = headers.get("id") if isinstance(headers, dict) else None
    return found if isinstance(found, str) else ""


def call(envelope: Envelope) -> tuple[list, dict, dict]:
    """The Celery call an envelope carries: (args, kwargs, embed)."""
    args, kwargs, embed = json.loads(base64.b64decode(envelope["body"]))
    return args, kwargs, embed


def with_call(envelope: Envelope, args: list, kwargs: dict, embed: dict) -> Envelope:
    body = base64.b64encode(json.dumps([args, kwargs, embed]).encode()).decode()
    return {**envelope, "body": body}


def with_properties(envelope: Envelope, **changes: Any) -> Envelope:
    return {**envelope, "properties": {**envelope["properties"], **changes}}


def addressed_to(envelope: Envelope, queue: str) -> Envelope:
    """The same message, delivered as if published to ``queue`` (a lane's exchange)."""
    return with_properties(envelope, delivery_info={"exchange": queue, "routing_key": queue})


def problem(item: Any) -> str | None:
    """Why a lane item is not an envelope kombu can hand over, or None."""
    if not isinstance(item, dict):
        return f"a JSON {type(item).__name__}, not a message envelope"
    properties = item.get("properties")
    if not isinstance(properties, dict):
        return "a message envelope without properties"
    if not isinstance(properties.get("delivery_tag"), str):
        return "a message envelope without a delivery tag"
    if not isinstance(properties.get("delivery_info", {}), dict):
        return "a message envelope whose delivery_info is not a mapping"
    if not isinstance(item.get("headers") or {}, dict):
        return "a message envelope whose headers are not a mapping"
    return _body_problem(item.get("body"), properties.get("body_encoding"))


def _body_problem(body: Any, encoding: Any) -> str | None:
    if not isinstance(body, (str, type(None))):
        return f"a message envelope whose body is a {type(body).__name__}, not text"
    if body and encoding == "base64":
        try:
            base64.b64decode(body)  # as kombu will: it raises in the middle of its read
        except ValueError as exc:  # binascii.Error among them
            return f"a message envelope whose body is not base64 ({exc})"
    return None
