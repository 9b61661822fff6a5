"""A job's inputs as ``lanes submit`` takes them from the shell: ``--input KEY=VALUE``
(repeated), ``KEY=@FILE`` and ``--input-json '{...}'``, typed by the model's ``Input``.

A value is JSON where JSON makes sense (``repeat=2`` is the number 2, ``tags=["a"]`` a
list) and text where the field takes text (``text=2`` stays ``"2"``); text that is not
JSON stays text. ``@FILE`` reads the value from a file, typed the same way. A bad pair
raises :class:`~tasks.errors.InvalidJob` naming the field; the model's ``Input`` checks
the rest in ``submit()``.
"""
from __future__ import annotations

import json
import types
import typing
from pathlib import Path
from typing import Any, Iterable

from tasks.errors import InvalidJob

#: What an image model (``tasks.jobs.schema``) takes as text; its other inputs are numbers.
IMAGE_TEXT = frozenset({"prompt"})


def parse_inputs(model: str, pairs: Iterable[str], as_json: str | None) -> dict[str, Any]:
    """The inputs of a job of ``model`` from ``--input-json`` and ``--input`` pairs; a
    key given twice is refused."""
    inputs = _json_object(as_json) if as_json else {}
    text_fields = text_inputs(model)
    for pair in pairs:
        key, sep, raw = pair.partition("=")
        key = key.strip()
        if not sep or not key:
            raise InvalidJob("input", f"expected KEY=VALUE, got {pair!r}")
        if key in inputs:
            raise InvalidJob(key, "is given twice")
        inputs[key] = typed_value(key, _read(key, raw), key in text_fields)
    return inputs


def typed_value(key: str, raw: str, text: bool) -> Any:
    """``raw`` as the field takes it: itself for a text field, else its JSON value (text
    that is not JSON stays text, for the model's ``Input`` to judge)."""
    if text:
        return raw
    try:
        return json.loads(raw)
    except ValueError:
        return raw


def text_inputs(model: str) -> frozenset[str]:
    """The inputs of ``model`` that take text (an unknown model: none, and ``submit()``
    names it)."""
    from tasks.jobs import catalog
    from tasks.settings import settings

    if model not in settings.models:
        return frozenset()
    found = catalog.spec(model)
    if found.cls is None:
        return IMAGE_TEXT
    return frozenset(name for name, field in found.Input.model_fields.items()
                     if takes_text(field.annotation))


def takes_text(annotation: Any) -> bool:
    """Whether a field of this type takes text only: ``str`` (or a subclass, a str
    enum), ``bytes``, a ``Literal`` of strings, or an optional or union of those."""
    if isinstance(annotation, type):
        return issubclass(annotation, (str, bytes))
    origin, args = typing.get_origin(annotation), typing.get_args(annotation)
    if origin is typing.Literal:
        return all(isinstance(arg, str) for arg in args)
    if origin is typing.Annotated:
        return takes_text(args[0])
    if origin in (typing.Union, types.UnionType):
        others = [arg for arg in args if arg is not type(None)]
        return bool(others) and all(takes_text(arg) for arg in others)
    return False


def _read(key: str, raw: str) -> str:
    """``raw``, or the text of the file ``@FILE`` names."""
    if not raw.startswith("@"):
        return raw
    try:
        return Path(raw[1:]).read_text()
    except (OSError, UnicodeDecodeError) as exc:
        raise InvalidJob(key, f"cannot read {raw[1:]!r}: {exc}") from None


def _json_object(raw: str) -> dict[str, Any]:
    """``--input-json``: a JSON object (``@FILE`` reads it from a file)."""
    try:
        found = json.loads(_read("input-json", raw))
    except ValueError as exc:
        raise InvalidJob("input-json", f"is not JSON: {exc}") from None
    if not isinstance(found, dict):
        raise InvalidJob("input-json", f"must be a JSON object, got {type(found).__name__}")
    return found
