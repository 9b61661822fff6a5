"""Every Lua script: a file under tasks/broker/lua with its KEYS/ARGV header (a shared
function: what it computes), loaded by one loader, compiled by the real Redis, run by
some module, and holding no setting in its source."""
from __future__ import annotations

import re
from pathlib import Path

import pytest

from tasks.broker import scripts

ROOT = Path(__file__).resolve().parent.parent
NAMES = sorted(path.stem for path in scripts.LUA_DIR.glob("*.lua"))
CODE = "".join(path.read_text() for folder in ("tasks", "beat", "gpu_worker")
               for path in (ROOT / folder).rglob("*.py"))


def _included(name: str) -> bool:
    return any(f"-- include: {name}\n" in (scripts.LUA_DIR / f"{other}.lua").read_text()
               for other in NAMES)


@pytest.mark.parametrize("name", NAMES)
def test_each_script_has_its_header_and_a_user(name):
    text = (scripts.LUA_DIR / f"{name}.lua").read_text()
    assert text.startswith("-- "), f"{name}.lua starts without its header"
    if _included(name):  # a shared function, taken in by others
        assert re.search(r"^local function \w+", text, re.M)
    else:
        header = "".join(line for line in text.splitlines(True) if line.startswith("--"))
        assert "KEYS:" in header, f"{name}.lua: no KEYS header"
        assert "ARGV" in header or "ARGV[" not in text, f"{name}.lua: no ARGV header"
        assert f'"{name}"' in CODE, f"no module runs {name}.lua"


@pytest.mark.parametrize("name", NAMES)
def test_each_script_compiles_in_redis(name, clean_redis):
    sha = clean_redis.script_load(scripts.source(name))
    assert sha == scripts.script(name).sha  # the SHA every caller sends with EVALSHA


def test_includes_are_expanded_and_no_setting_is_frozen_in():
    assert "-- include:" not in scripts.source("run_finish")
    assert "local function settle" in scripts.source("run_finish")
    assert "local function holds" in scripts.source("run_release")
    for name in NAMES:  # templating would be %(...)s or {...}: values travel as ARGV
        assert not re.search(r"%\(|%s|%d|\{\w+\}", scripts.source(name)), name


def test_one_script_object_per_name():
    assert scripts.script("publish") is scripts.script("publish")
