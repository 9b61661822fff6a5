"""Every Lua script gpulanes runs, read from ``tasks/broker/lua/<name>.lua``.

Each file starts with its KEYS/ARGV header; a line ``-- include: <name>`` takes in
a shared function (``holds``, ``add_fast``). A script's SHA is computed once per
process; it is sent with EVALSHA on whichever client or pipeline runs it, and
loaded on a Redis that does not know it yet (redis-py's ``Script``). Nothing of
a setting is written into a script's source: settings travel as ARGV.
"""
from __future__ import annotations

import re
import threading
from functools import lru_cache
from pathlib import Path
from typing import Any, Sequence

from redis.commands.core import Script

LUA_DIR = Path(__file__).with_name("lua")
_INCLUDE = re.compile(r"^-- include: (\w+)$", re.M)
_lock = threading.Lock()
_scripts: dict[str, Script] = {}


@lru_cache(maxsize=None)
def source(name: str) -> str:
    """The text of script ``name``, its includes expanded."""
    text = (LUA_DIR / f"{name}.lua").read_text()
    return _INCLUDE.sub(lambda found: source(found.group(1)).rstrip("\n"), text)


def script(name: str) -> Script:
    """Script ``name``, made once per process (its SHA with it)."""
    with _lock:
        if name not in _scripts:
            _scripts[name] = Script(None, source(name).encode())  # bytes: no encoder needed
        return _scripts[name]


def run(client: Any, name: str, keys: Sequence[Any], args: Sequence[Any]) -> Any:
    """Run script ``name`` on ``client`` (a client or a pipeline)."""
    return script(name)(keys=keys, args=args, client=client)
