"""The job schema and its validation: every field checked before enqueue."""
from __future__ import annotations

import re
import reprlib
import secrets
import unicodedata
from typing import Any

from routing.names import TIERS
from tasks.broker.message import PARAMETERS, Job
from tasks.errors import InvalidJob
from tasks.settings import settings

MAX_SEED = 2**63 - 1
_ACCOUNT_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.@:+-]*")
#: Error messages quote a bad value only this far: a caller's 10 MB string stays out of logs.
_SHORT = reprlib.Repr()
_SHORT.maxstring = _SHORT.maxother = 60


def shown(value: Any) -> str:
    """``value`` as an error message quotes it: short, and safe for any object."""
    if type(value) is int and value.bit_length() > 64:  # str() of a huge int can raise
        return f"an integer of {value.bit_length()} bits"
    return _SHORT.repr(value)


def model_names() -> tuple[str, ...]:
    """The models a job may name (``GPULANES_MODELS``)."""
    return tuple(sorted(settings.models))


def _integer(field: str, value: Any, low: int, high: int) -> int:
    # bool is an int subclass; True steps is a bug, not a request for one step.
    if type(value) is not int:
        raise InvalidJob(field, f"must be an integer, got {type(value).__name__} {shown(value)}")
    if not low <= value <= high:
        raise InvalidJob(field, f"must be between {low} and {high}, got {shown(value)}")
    return value


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


def _side(field: str, value: Any) -> int:
    _integer(field, value, settings.min_side, settings.max_side)
    if value % 8:
        raise InvalidJob(field, f"must be a multiple of 8, got {value}")
    return value


def check_account(value: Any) -> str:
    """An account name, or :class:`InvalidJob` naming ``account``."""
    account = _text("account", value, settings.max_account_chars)
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


def validate(prompt: Any, *, tier: Any, account: Any, model: Any, seed: Any,
             steps: Any, width: Any, height: Any, downgradable: Any = None) -> Job:
    """Check every field; raise :class:`InvalidJob` naming the first bad one."""
    tier = _choice("tier", tier, TIERS)
    return Job(
        prompt=_text("prompt", prompt, settings.max_prompt_chars),
        tier=tier,
        account=check_account(account),
        model=_choice("model", model, model_names()),
        seed=secrets.randbelow(MAX_SEED) if seed is None else _integer("seed", seed, 0, MAX_SEED),
        steps=_integer("steps", steps, 1, settings.max_steps),
        width=_side("width", width),
        height=_side("height", height),
        downgradable=_downgradable(downgradable, tier),
    )


#: The fields of a job as a message carries it.
JOB_FIELDS = PARAMETERS


def check_job(job: Any) -> Job:
    """A job dict taken from a message, checked as ``submit()`` checks its arguments
    (other keys, such as a run's bookkeeping, are left alone)."""
    if not isinstance(job, dict):
        raise InvalidJob("job", f"must be a mapping of job fields, got {type(job).__name__}")
    for field in JOB_FIELDS:
        if field not in job:
            raise InvalidJob(field, "is missing from the job")
    if job["seed"] is None:
        raise InvalidJob("seed", "must be an integer in a queued job")
    return validate(**{field: job[field] for field in JOB_FIELDS})
