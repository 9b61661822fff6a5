"""Inputs that standard JSON carries as given, checked in one walk of the validated
values: not nested too deep, no NaN or infinity, text that is valid Unicode, bytes
that are UTF-8, string keys, integers of sane size. A job's message is standard JSON
(``allow_nan=False``), and every reader of it (pydantic, json, a model's own code)
gets exactly what the caller sent."""
from __future__ import annotations

import math
import reprlib
from dataclasses import fields, is_dataclass
from typing import Any, Iterable, Sequence

from pydantic import BaseModel

from tasks.errors import InvalidJob

#: How deep lists, dicts and models may nest in an input: every reader of a message
#: (pydantic, json, a model's own code) recurses over them.
MAX_DEPTH = 64
#: Integers of more bits are refused: no input needs them, and Python writes no more
#: than a few thousand digits as text.
MAX_INT_BITS = 4096

#: Error messages quote a bad value only this far: a caller's 10 MB string stays out of logs.
_SHORT = reprlib.Repr()
_SHORT.maxstring = _SHORT.maxother = 60


def shown(value: Any) -> str:
    """``value`` as an error message quotes it: short, and safe for any object."""
    if type(value) is int and value.bit_length() > 64:  # str() of a huge int can raise
        return f"an integer of {value.bit_length()} bits"
    return _SHORT.repr(value)

#: Leaves that JSON always carries as given.
_PLAIN = frozenset({bool, type(None)})
TOO_DEEP = (f"nests lists, dicts or models more than {MAX_DEPTH} levels deep; flatten "
             f"it to at most {MAX_DEPTH}")


class _Unfit(Exception):
    """A value a message's standard JSON would refuse, alter or lose; ``path``, from
    the value up to the inputs, is filled in on the way up."""

    def __init__(self, problem: str) -> None:
        super().__init__(problem)
        self.problem, self.path = problem, []


def fit_for_json(typed: BaseModel) -> None:
    """One walk of the validated inputs: :class:`InvalidJob` naming the first value the
    message's JSON cannot carry as given (too deep, NaN or infinity, bytes that are not
    text, a key that is not a string, a lone surrogate, a huge integer)."""
    bytes_as_text = type(typed).model_config.get("ser_json_bytes", "utf8") == "utf8"
    try:
        _check_json(typed, 0, bytes_as_text)
    except _Unfit as unfit:
        raise InvalidJob(dotted(unfit.path[::-1]) or "inputs",
                         unfit.problem) from unfit.__cause__


def _check_json(value: Any, depth: int, bytes_as_text: bool) -> None:
    """Raise :class:`_Unfit` if ``value``, ``depth`` containers down, cannot be JSON."""
    members = _members(value)
    if members is None:
        _check_leaf(value, bytes_as_text)
        return
    if depth > MAX_DEPTH:
        raise _Unfit(TOO_DEEP)
    for key, item in members:
        kind = type(item)
        if (kind is str and item.isascii() or kind in _PLAIN
                or kind is int and item.bit_length() <= MAX_INT_BITS
                or kind is float and math.isfinite(item)):
            continue  # the common leaves, fit as they are: checked here, without a call
        try:
            _check_json(item, depth + 1, bytes_as_text)
        except _Unfit as unfit:
            unfit.path.append(key)
            raise


def _check_leaf(value: Any, bytes_as_text: bool) -> None:
    if isinstance(value, str):
        if not value.isascii():  # the common case costs no encoding
            _unicode(value, "is")
    elif isinstance(value, float):
        if not math.isfinite(value):  # pydantic would write null, json.dumps NaN
            raise _Unfit(f"is {value!r}; standard JSON has no NaN or infinity: pass a "
                         "finite number")
    elif isinstance(value, int):
        if value.bit_length() > MAX_INT_BITS:
            raise _Unfit(f"is {shown(value)}; the limit is {MAX_INT_BITS} bits: pass "
                         "it as a string")
    elif isinstance(value, (bytes, bytearray)) and bytes_as_text:
        _utf8_bytes(value)


def _members(value: Any) -> Iterable[tuple[Any, Any]] | None:
    """(key, item) of what JSON writes as an array or an object; None for a leaf."""
    if isinstance(value, dict):
        return _keyed(value)
    if isinstance(value, (list, tuple, set, frozenset)):
        return enumerate(value)
    if isinstance(value, BaseModel):
        return [*value.__dict__.items(), *(value.__pydantic_extra__ or {}).items()]
    if is_dataclass(value) and not isinstance(value, type):
        return [(f.name, getattr(value, f.name)) for f in fields(value)]
    return None  # pydantic writes it (a date, a Decimal) or refuses it (_as_json)


def _keyed(mapping: dict[Any, Any]) -> Iterable[tuple[Any, Any]]:
    for key, item in mapping.items():
        # pydantic would write str(key): 1 and "1" would collide, (1, 2) become "1,2"
        if not isinstance(key, str):
            raise _Unfit(f"has the key {shown(key)} ({type(key).__name__}); JSON keys "
                         "are strings: use str keys")
        if not key.isascii():
            _unicode(key, "has a key that is")
        yield key, item


def _unicode(text: str, what: str) -> None:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:  # a lone surrogate: no message, log or hash can carry it
        raise _Unfit(f"{what} not valid Unicode text ({exc.reason} at position "
                     f"{exc.start}); remove the lone surrogate") from exc


def _utf8_bytes(data: bytes | bytearray) -> None:
    try:
        data.decode("utf-8")
    except UnicodeDecodeError as exc:  # pydantic writes bytes as UTF-8 text
        raise _Unfit(f"holds bytes that are not UTF-8 text ({exc.reason} at byte "
                     f"{exc.start}); inputs travel as JSON text: base64-encode binary "
                     "data into a str") from exc


def as_json(typed: BaseModel) -> dict[str, Any]:
    """``typed`` as JSON data; :class:`InvalidJob` naming the field pydantic cannot write
    (an object of a type it does not know)."""
    try:
        return typed.model_dump(mode="json")
    except (ValueError, TypeError) as exc:
        field = next((name for name in type(typed).model_fields
                      if not _writable(typed, name)), "inputs")
        raise InvalidJob(field, f"holds a value JSON cannot carry ({str(exc)[:120]}); "
                         "pass numbers, text, lists and dicts") from exc


def _writable(typed: BaseModel, name: str) -> bool:
    try:
        typed.model_dump(mode="json", include={name})
    except (ValueError, TypeError):
        return False
    return True


#: A dotted path of more parts shows its first and last ones only.
_PATH_PARTS = 8


def dotted(path: Sequence[Any]) -> str:
    """``path`` (field names, keys, indexes) as a field's dotted name, kept short."""
    parts = [part if isinstance(part, str) and len(part) <= 40 and part.isprintable()
             else str(part) if isinstance(part, int) else shown(part) for part in path]
    if len(parts) > _PATH_PARTS:
        parts = [*parts[:4], "\u2026", *parts[-3:]]
    return ".".join(parts)
