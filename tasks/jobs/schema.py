"""The job schema and its validation: every field checked before enqueue."""
from __future__ import annotations

import json
import re
import secrets
import unicodedata
from types import MappingProxyType
from typing import Any

from pydantic import ValidationError

from routing.names import TIERS
from tasks.broker.message import BOOKKEEPING, ROUTING, Job, is_cost
from tasks.errors import InvalidJob, ModelError
from tasks.jobs import catalog
from tasks.jobs.image import MAX_PROMPT_CHARS, MAX_SEED, ImageInput
from tasks.jobs.jsonfit import TOO_DEEP, as_json, dotted, fit_for_json, shown
from tasks.settings import settings

#: Longest account name, in characters.
MAX_ACCOUNT_CHARS = 64
_ACCOUNT_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.@:+-]*")
def model_names() -> tuple[str, ...]:
    """The models a job may name (``GPULANES_MODELS``)."""
    return tuple(sorted(settings.models))


#: Unicode categories that show nothing on their own: formats (zero-width spaces and
#: joiners, bidi controls), controls, separators, and combining marks with no base.
INVISIBLE_CATEGORIES = frozenset({"Cf", "Cc", "Zs", "Zl", "Zp", "Mn", "Me"})
#: Letters and symbols that render blank (Hangul fillers, the blank Braille pattern).
BLANK_CHARACTERS = frozenset("\u115f\u1160\u3164\uffa0\u2800")


def _visible(text: str) -> bool:
    """Whether ``text`` shows anything: not only blanks and invisible characters."""
    return any(unicodedata.category(ch) not in INVISIBLE_CATEGORIES
               and ch not in BLANK_CHARACTERS and not ch.isspace() for ch in text)


def _text(field: str, value: Any, max_chars: int) -> str:
    if not isinstance(value, str):
        raise InvalidJob(field, f"must be a string, got {type(value).__name__}")
    if not value.strip():
        raise InvalidJob(field, "must not be empty")
    if len(value) > max_chars:
        raise InvalidJob(field, f"is {len(value)} characters; the limit is {max_chars}")
    if "\x00" in value:
        raise InvalidJob(field, "must not contain NUL characters")
    try:
        value.encode("utf-8")
    except UnicodeEncodeError as exc:  # a lone surrogate: no message, log or hash can carry it
        raise InvalidJob(field, f"is not valid Unicode text ({exc.reason} at "
                         f"position {exc.start})") from None
    if not _visible(value):
        raise InvalidJob(field, "holds only invisible characters (zero-width, bidi controls, "
                         "blanks); it must show some text")
    return value


def _choice(field: str, value: Any, allowed: tuple[str, ...] | list[str]) -> str:
    if not isinstance(value, str):
        raise InvalidJob(field, f"must be a string, got {type(value).__name__}")
    if value not in allowed:
        raise InvalidJob(field, f"unknown {field} {shown(value)}; use one of {', '.join(allowed)}")
    return value


def check_account(value: Any) -> str:
    """An account name, or :class:`InvalidJob` naming ``account``."""
    account = _text("account", value, MAX_ACCOUNT_CHARS)
    if not _ACCOUNT_RE.fullmatch(account):
        raise InvalidJob("account", "may hold letters, digits and _.@:+- and must "
                         "start with a letter or digit")
    return account


def _downgradable(value: Any, tier: str) -> bool:
    # Standard work may move down under load by default; paid fast work may not.
    if value is None:
        return tier == "standard"
    if not isinstance(value, bool):
        raise InvalidJob("downgradable", f"must be True, False or None, got {shown(value)}")
    return value


#: An image model's inputs and, for a new job, their defaults (a seed is drawn).
IMAGE_DEFAULTS: dict[str, Any] = {name: None if field.is_required() else field.default
                                  for name, field in ImageInput.model_fields.items()}
#: The fields of an image job as its message carries them.
JOB_FIELDS: tuple[str, ...] = ("prompt", "tier", "account", "model", "seed", "steps", "width",
                               "height", "downgradable")


def image_inputs(raw: dict[str, Any], queued: bool = False) -> dict[str, Any]:
    """An image model's inputs checked; ``queued``: taken from a message (no defaults, a
    seed given), else a new job's (defaults applied, a seed drawn if none)."""
    _no_unknown(raw, IMAGE_DEFAULTS)
    if queued and (missing := [f for f in IMAGE_DEFAULTS if f not in raw]):
        raise InvalidJob(missing[0], "is missing from the job")
    typed = _typed(ImageInput, raw)
    if queued and typed.seed is None:
        raise InvalidJob("seed", "must be an integer in a queued job")
    _text("prompt", typed.prompt, MAX_PROMPT_CHARS)  # text that shows: more than its type
    seed = secrets.randbelow(MAX_SEED) if typed.seed is None else typed.seed
    return {**typed.model_dump(), "seed": seed}


def _checked(found: catalog.ModelSpec, raw: dict[str, Any],
             queued: bool) -> tuple[dict[str, Any], Any]:
    """The inputs as JSON, and as the model's ``Input`` (None for an image model)."""
    if found.cls is None:
        return _within_size(image_inputs(raw, queued)), None
    _no_unknown(raw, found.Input.model_fields)
    typed = _typed(found.Input, raw)
    fit_for_json(typed)
    return _within_size(as_json(typed)), typed


def _typed(input_type: Any, raw: dict[str, Any]) -> Any:
    """``raw`` as a model's ``Input``; a pydantic error becomes :class:`InvalidJob`
    naming the field."""
    try:
        return input_type.model_validate(raw)
    except ValidationError as exc:
        first = exc.errors()[0]
        deep = first["type"] in ("recursion_depth_exceeded", "recursion_loop")  # or cyclic
        message = TOO_DEEP if deep else first["msg"]
        raise InvalidJob(dotted(first["loc"]) or "inputs", message) from None


def _no_unknown(raw: dict[str, Any], known: Any) -> None:
    if unknown := [name for name in raw if name not in known]:
        raise InvalidJob(dotted(unknown[:1]), f"is not an input of this model; it takes "
                         f"{', '.join(known) or 'none'}")


def _within_size(inputs: dict[str, Any]) -> dict[str, Any]:
    """Validated inputs, if their JSON is standard and within ``GPULANES_MAX_INPUT_BYTES``."""
    try:
        size = len(json.dumps(inputs, ensure_ascii=False, allow_nan=False).encode())
    except ValueError as exc:  # only a model's own serializer can get here
        raise InvalidJob("inputs", f"cannot be written as standard JSON ({exc}); the "
                         "model's Input must write finite numbers and valid text") from exc
    if size > settings.max_input_bytes:
        raise InvalidJob("inputs", f"are {size} bytes as JSON; the limit is "
                         f"GPULANES_MAX_INPUT_BYTES={settings.max_input_bytes}")
    return inputs


def validate_job(*, tier: Any, account: Any, model: Any, downgradable: Any = None,
                 inputs: dict[str, Any], queued: bool = False) -> Job:
    """Check every field; raise :class:`InvalidJob` naming the first bad one."""
    tier = _choice("tier", tier, TIERS)
    account = check_account(account)
    model = _choice("model", model, model_names())
    found = catalog.spec(model)
    checked, typed = _checked(found, inputs, queued)
    return Job(tier=tier, account=account, model=model,
               downgradable=_downgradable(downgradable, tier),
               inputs=MappingProxyType(checked), route_key=_route_key(found, typed),
               cost=_cost(found, checked, typed))


def _route_key(found: catalog.ModelSpec, typed: Any) -> str | None:
    route_key = getattr(found.cls, "route_key", None)
    if route_key is None:
        return None
    key = route_key(typed)
    return None if key is None else str(key)


#: The image job that costs 1.0: the defaults' steps and pixels.
_IMAGE_UNIT = IMAGE_DEFAULTS["steps"] * IMAGE_DEFAULTS["width"] * IMAGE_DEFAULTS["height"]


def _cost(found: catalog.ModelSpec, checked: dict[str, Any], typed: Any) -> float:
    """The job's work relative to a typical one: an image model's steps times pixels
    over the defaults'; a class model's ``cost(inputs)`` (1.0 when it declares none)."""
    if found.cls is None:
        return float(f"{checked['steps'] * checked['width'] * checked['height'] / _IMAGE_UNIT:.6g}")
    declared = getattr(found.cls, "cost", None)
    if declared is None:
        return 1.0
    try:
        cost = declared(typed)
        rounded = float(f"{cost:.6g}") if is_cost(cost) else None
    except Exception as exc:  # noqa: BLE001  the model's own code: named, never raw
        raise ModelError(f"model {found.name!r} ({found.target}): cost(inputs) raised "
                         f"{type(exc).__name__}: {exc}") from exc
    if not is_cost(rounded):
        raise ModelError(f"model {found.name!r} ({found.target}): cost(inputs) returned "
                         f"{shown(cost)}; it must be a positive number")
    return rounded


def validate(prompt: Any = None, *, tier: Any = "standard", account: Any = "anonymous",
             model: Any = "demo", downgradable: Any = None, **inputs: Any) -> Job:
    """A new job as ``submit()`` takes it: the routing keywords, every other one an input
    of the model (an image model's prompt may come first, positionally)."""
    if prompt is not None:
        inputs = {"prompt": prompt, **inputs}
    return validate_job(tier=tier, account=account, model=model, downgradable=downgradable,
                        inputs=inputs)


def check_job(job: Any) -> Job:
    """A job dict taken from a message, checked as ``submit()`` checks its arguments
    (a run's bookkeeping, such as ``leads_run``, is left alone)."""
    if not isinstance(job, dict):
        raise InvalidJob("job", f"must be a mapping of job fields, got {type(job).__name__}")
    for field in ROUTING:
        if field not in job:
            raise InvalidJob(field, "is missing from the job")
    inputs = {k: v for k, v in job.items() if k not in ROUTING and k not in BOOKKEEPING}
    return validate_job(**{k: job[k] for k in ROUTING}, inputs=inputs, queued=True)
