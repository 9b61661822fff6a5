"""What a create request carries: its JSON body, and the headers that shape it
(``Idempotency-Key``, ``Cancel-After``, ``Prefer: wait=N``), each checked with the
header named when it is bad."""
from __future__ import annotations

import inspect
import math
import re
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from routing.names import FAST, RELAXED, STANDARD
from tasks.api import CANCEL_AFTER_MAX_S, submit
from tasks.broker.message import BOOKKEEPING, ROUTING
from tasks.front.errors import Refused

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

    def inputs(self) -> dict[str, Any]:
        """The input as ``submit()``'s keywords; a name it keeps for itself is refused."""
        if clash := sorted(set(self.input) & RESERVED):
            raise Refused(422, f"input.{clash[0]}: is not an input of any model (it is "
                          "set by the request or the API key)", f"input.{clash[0]}")
        return self.input


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
