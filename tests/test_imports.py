"""Import rules outside the packages import-linter checks (setup.cfg): the tests never
import a benchmark (``tests.harness`` is what both share), and the benchmarks import
each other without a cycle. Read from the source with ``ast``: nothing is imported."""
from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def module_name(path: Path) -> str:
    """``benchmarks/simulate/run.py`` -> ``benchmarks.simulate.run``."""
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imported(path: Path, package: str = "") -> set[str]:
    """Every module name ``path`` imports, at any depth of its code (type-checking and
    function-level imports included); ``from a import b`` gives ``a`` and ``a.b``.
    ``package``: the one ``path`` is in, for its relative imports."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = package.rsplit(".", node.level - 1)[0] if node.level else ""
            module = ".".join(filter(None, [base, node.module or ""]))
            found.add(module)
            found.update(f"{module}.{alias.name}" for alias in node.names)
    return found


def package_of(path: Path) -> str:
    """The package a module file is in (a package's ``__init__``: itself)."""
    name = module_name(path)
    return name if path.name == "__init__.py" else name.rpartition(".")[0]


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected parts of ``graph`` with more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        for other in sorted(graph[node]):
            if other not in index:
                visit(other)
                low[node] = min(low[node], low[other])
            elif other in stack:
                low[node] = min(low[node], index[other])
        if low[node] == index[node]:
            part = stack[stack.index(node):]
            del stack[stack.index(node):]
            if len(part) > 1:
                found.append(sorted(part))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def test_no_test_imports_a_benchmark():
    offenders = {str(path.relative_to(ROOT)): sorted(
        name for name in imported(path, package_of(path)) if name.split(".")[0] == "benchmarks")
        for path in sorted((ROOT / "tests").rglob("*.py"))}
    assert not {path: names for path, names in offenders.items() if names}, (
        "tests import benchmark code; share it through tests/harness instead")


def test_the_benchmarks_import_each_other_without_a_cycle():
    modules = {module_name(path): path for path in (ROOT / "benchmarks").rglob("*.py")}
    graph = {name: (imported(path, package_of(path)) & modules.keys()) - {name}
             for name, path in modules.items()}
    assert "benchmarks.overload_plan" in graph["benchmarks.overload_report"]  # type-checking
    assert not cycles(graph)


def test_the_checks_find_what_they_look_for(tmp_path):
    """The two checks above see a relative, a function-level and a type-checking import,
    and a cycle of three."""
    source = tmp_path / "probe.py"
    source.write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n"
                      "    from benchmarks.overload import Budgets\n"
                      "def f():\n    import benchmarks.lanes\n"
                      "from . import queues\nfrom ..common import PROMPT\n")
    assert imported(source, "benchmarks.simulate") >= {
        "benchmarks.overload", "benchmarks.lanes", "benchmarks.simulate.queues",
        "benchmarks.common"}
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert cycles({"a": {"b"}, "b": set()}) == []
