"""The configuration page, generated from the settings object.

``python -m tasks.dev.config_table > docs/configuration.md`` rewrites the page: one row
per field of :class:`tasks.settings.Settings` (its ``GPULANES_*`` variable, type,
default and description), grouped by the ``# --- section ---`` comments of the class.
A default that another setting derives (``None``) prints as the rule its description
gives after ``Unset:``. ``tests/test_docs.py`` fails while the page is stale.
"""
from __future__ import annotations

import inspect
import re
import sys
import types
import typing
from pathlib import Path
from typing import Any, Iterator

import annotated_types
from pydantic.fields import FieldInfo

import tasks.settings as settings_module
from tasks.settings import PREFIX, Settings
from tasks.settings_retired import RETIRED

#: Where the page lives, from the project folder.
PAGE = Path("docs") / "configuration.md"
COMMAND = f"python -m tasks.dev.config_table > {PAGE}"
PROJECT_DIR = Path(settings_module.__file__).resolve().parent.parent
#: ``# --- where things live ---`` in the class body: a section's title.
SECTION = re.compile(r"^\s*# -+ (.+?) -*$")
FIELD = re.compile(r"^\s+(\w+)\s*:")
#: The rule a derived default follows, as its description states it.
RULE = re.compile(r"\b[Uu]nset:\s*(.+?)(?:\.\s|\.$|$)", re.S)
LONG = 60  #: a default longer than this prints its names only

INTRO = f"""\
<!-- Generated from tasks/settings.py by `{COMMAND}`: edit the settings, not this page. -->
# Configuration

*This page is generated from the settings object (`tasks/settings.py`); regenerate it
with `{COMMAND}`.*

Every setting is an environment variable `GPULANES_<NAME>`, a field of one typed
settings object (pydantic-settings) validated once. A malformed value, or settings
that contradict each other, stop the process with `tasks.errors.ConfigError` naming
the variable. Code reads `settings.max_job_s` where it uses it, so a test varies a
setting in process: `with override(max_job_s=5): ...`. Folder defaults are relative
to the project folder (where `tasks/` lives); an installed package (the Docker image)
sets them explicitly.
"""


def markdown() -> str:
    """The whole page: the introduction, then a table per section of the settings."""
    parts = [INTRO]
    for title, names in sections():
        parts.append(f"\n## {title[:1].upper()}{title[1:]}\n\n"
                     "| variable | type | default | meaning |\n|---|---|---|---|\n")
        parts.extend(row(name, Settings.model_fields[name]) for name in names)
    parts.append(retired())
    return "".join(parts)


def retired() -> str:
    """The variables no longer read: setting one stops the process, saying this."""
    rows = "".join(f"| `{PREFIX}{name}` | {instead} |\n"
                   for name, instead in sorted(RETIRED.items()))
    return ("\n## Retired variables\n\nSetting one of these stops the process with a "
            "`ConfigError` that says what took its place.\n\n"
            f"| variable | instead |\n|---|---|\n{rows}")


def sections() -> list[tuple[str, list[str]]]:
    """The settings' fields grouped under the class's section comments, in order."""
    found: list[tuple[str, list[str]]] = [("settings", [])]
    for line in inspect.getsource(Settings).splitlines():
        if title := SECTION.match(line):
            found.append((title.group(1), []))
        elif (name := FIELD.match(line)) and name.group(1) in Settings.model_fields:
            found[-1][1].append(name.group(1))
    listed = {name for _, names in found for name in names}
    found[0][1].extend(name for name in Settings.model_fields if name not in listed)
    return [(title, names) for title, names in found if names]


def row(name: str, field: FieldInfo) -> str:
    """One table row: variable, type, default, description."""
    cells = (f"`{PREFIX}{name.upper()}`", type_text(field.annotation, field.metadata),
             default_text(field), describe(field.description or ""))
    return "| " + " | ".join(cell.replace("|", "\\|") for cell in cells) + " |\n"


def describe(text: str) -> str:
    """A description as one Markdown line (reST ``literals`` as code)."""
    return re.sub(r"``(.+?)``", r"`\1`", " ".join(text.split()))


def default_text(field: FieldInfo) -> str:
    """The default as an operator would write it, or the rule that derives it (an unset
    or empty default whose description says ``Unset: <rule>``)."""
    value = field.default_factory() if field.default_factory else field.default
    rule = RULE.search(describe(field.description or ""))
    if value is None or (rule and not value and not isinstance(value, (bool, int, float))):
        return f"*{rule.group(1)}*" if rule else "unset"
    return value_text(value)


def value_text(value: Any) -> str:
    """``value`` in the form its environment variable takes."""
    if isinstance(value, bool):
        return f"`{str(value).lower()}`"
    if isinstance(value, Path):
        return f"`{_relative(value)}`"
    if isinstance(value, dict) and not value:
        return "none"
    if isinstance(value, dict):
        pairs = ",".join(f"{k}={value_text(v).strip('`')}" for k, v in value.items())
        return f"`{pairs}`" if len(pairs) <= LONG else _names(list(value))
    if isinstance(value, (tuple, list)):
        return f"`{','.join(map(str, value))}`" if value else "none"
    if isinstance(value, float):
        return f"`{value:g}`"
    return f"`{value}`"


def _relative(path: Path) -> str:
    try:
        return f"./{path.relative_to(PROJECT_DIR)}"
    except ValueError:
        return str(path)


def _names(names: list[str]) -> str:
    shown = names if len(names) <= 4 else [*names[:2], "…", *names[-2:]]
    return ", ".join(name if name == "…" else f"`{name}`" for name in shown) + \
        f" ({len(names)})"


def type_text(annotation: Any, metadata: list[Any]) -> str:
    """A field's type for people: ``number > 0``, ``auto, cpu or cuda``, ``path``."""
    args = typing.get_args(annotation)
    if typing.get_origin(annotation) is typing.Annotated:
        return type_text(args[0], [*metadata, *_constraints(annotation.__metadata__)])
    if typing.get_origin(annotation) in (typing.Union, types.UnionType):
        inner = [arg for arg in args if arg is not type(None)]
        return type_text(inner[0], metadata) if len(inner) == 1 else "any"
    if typing.get_origin(annotation) is typing.Literal:
        return ", ".join(f"`{a}`" for a in args[:-1]) + f" or `{args[-1]}`"
    base = _BASE.get(typing.get_origin(annotation) or annotation, str(annotation))
    return " ".join([base, *_bounds(_constraints(metadata))])


_BASE: dict[Any, str] = {bool: "bool", int: "int", float: "number", str: "text",
                         Path: "path", dict: "name=value,…", tuple: "name,…"}
_OPS = {"gt": ">", "ge": "≥", "lt": "<", "le": "≤"}


def _constraints(metadata: Any) -> Iterator[Any]:
    for item in metadata:
        yield from _constraints(item.metadata) if isinstance(item, FieldInfo) else [item]


def _bounds(items: Iterator[Any]) -> list[str]:
    bounds = []
    for item in items:
        if isinstance(item, annotated_types.BaseMetadata):
            bounds += [f"{sign} {getattr(item, op):g}" for op, sign in _OPS.items()
                       if getattr(item, op, None) is not None]
    return [" and ".join(bounds)] if bounds else []


def main() -> None:
    """Print the page (``> docs/configuration.md`` rewrites it)."""
    sys.stdout.write(markdown())


if __name__ == "__main__":
    main()
