"""The front page and the docs site say what the code does: the generated configuration
page is current and every setting is described, cited tests exist, README's links lead
somewhere, and README's model runs as written (its resume too)."""
from __future__ import annotations

import ast
import re
import sys
import types
from pathlib import Path
from typing import Any

import pytest
from pydantic.fields import FieldInfo

from tasks.dev import config_table
from tasks.errors import InvalidJob
from tasks.settings import PREFIX, Settings, override
from tasks.settings_retired import RETIRED

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
PAGES = sorted((ROOT / "docs").rglob("*.md"))
#: ``tests/test_x.py`` or ``tests/test_x.py::test_y`` as the docs cite them.
CITED = re.compile(r"tests/(test_\w+\.py)(?:::(test_\w+))?")
#: ``GPULANES_X`` as the docs name a setting.
SETTING = re.compile(r"GPULANES_[A-Z0-9_]*[A-Z0-9]")
#: Variables the test suite reads that are no settings.
NOT_SETTINGS = {"GPULANES_TEST_KEEP", "GPULANES_TEST_ARTIFACTS", "GPULANES_REQUIRE_BROWSER"}
#: A project file (``beat/lease.py``, ``lua/publish.lua``) or module (``routing.policy``).
FILE = re.compile(r"\b(?:(?:tasks|beat|gpu_worker|routing|benchmarks|docker|tests)/|lua/)"
                  r"[\w/.-]+\.(?:py|lua|ya?ml|json|md)\b")
MODULE = re.compile(r"`((?:tasks|beat|gpu_worker|routing)(?:\.\w+)+)")
LINK = re.compile(r"\]\(([^)\s#]+)(?:#[^)]*)?\)")
FRONT_PAGE_LINES = 300


def test_the_configuration_page_is_what_the_settings_give():
    page = (ROOT / config_table.PAGE).read_text()
    assert page == config_table.markdown(), (
        f"{config_table.PAGE} is stale: run `.venv/bin/{config_table.COMMAND}`")


def test_every_setting_has_a_description():
    missing = [f"{PREFIX}{name.upper()}" for name, field in Settings.model_fields.items()
               if not (field.description or "").strip()]
    assert not missing, "settings without a description (their attribute docstring): " \
                        + ", ".join(missing)


def test_a_derived_default_prints_its_rule_and_a_real_one_its_value():
    derived = FieldInfo(default=None, description="Seconds.  Unset: 2 x ``MAX_JOB_S``. More.")
    assert config_table.default_text(derived) == "*2 x `MAX_JOB_S`*"
    assert config_table.default_text(FieldInfo(default=None, description="A URL.")) == "unset"
    assert config_table.default_text(FieldInfo(default=0.25)) == "`0.25`"
    assert config_table.default_text(FieldInfo(default_factory=dict)) == "none"
    assert config_table.default_text(FieldInfo(default=(), description="Unset: all.")) == \
        "*all*"
    assert config_table.default_text(FieldInfo(default=0, description="Unset: all.")) == "`0`"
    assert config_table.value_text(config_table.PROJECT_DIR / ".x") == "`./.x`"


def test_the_docs_name_only_settings_that_exist():
    named = {(path.relative_to(ROOT), name) for path in [README, *PAGES]
             for name in SETTING.findall(path.read_text())}
    assert named, "no setting named: the pattern no longer matches how the docs name them"
    real = {f"{PREFIX}{field.upper()}" for field in Settings.model_fields} | NOT_SETTINGS
    retired = {f"{PREFIX}{name}" for name in RETIRED}  # listed as such on one page
    gone = sorted(f"{path}: {name}" for path, name in named if name not in real
                  and not (path.name == "configuration.md" and name in retired))
    assert not gone, "no such setting (tasks/settings.py): " + "; ".join(gone)


def test_the_docs_name_only_files_and_modules_that_exist():
    texts = {path.relative_to(ROOT): path.read_text() for path in [README, *PAGES]}
    assert all(pattern.search(texts[Path("docs/architecture.md")]) for pattern in (FILE, MODULE))
    gone = [f"{page}: {name}" for page, text in texts.items() for name in
            sorted(set(FILE.findall(text))) if not _file_exists(name)]
    gone += [f"{page}: {name}" for page, text in texts.items() for name in
             sorted(set(MODULE.findall(text))) if not _resolves(name)]
    assert not gone, "named in the docs but not in the code: " + "; ".join(gone)


def _file_exists(name: str) -> bool:
    found = ROOT / ("tasks/broker/" + name if name.startswith("lua/") else name)
    return found.exists() or (ROOT / "docs" / name).exists()


def _resolves(dotted: str) -> bool:
    """Whether ``tasks.jobs.accounts.grant_fast_seconds`` (a module, then names defined
    in it, a class's own among them) is there: read from the source, nothing imported."""
    parts = dotted.split(".")
    for cut in range(len(parts), 0, -1):
        base = ROOT.joinpath(*parts[:cut])
        source = base / "__init__.py" if base.is_dir() else base.with_suffix(".py")
        if source.exists():
            return _defined(ast.parse(source.read_text()).body, parts[cut:])
    return False


def _defined(body: list[ast.stmt], names: list[str]) -> bool:
    if not names:
        return True
    for node in body:
        if isinstance(node, ast.ClassDef) and node.name == names[0]:
            return _defined(node.body, names[1:])
        if names[1:]:
            continue
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name == names[0]:
            return True
        targets = node.targets if isinstance(node, ast.Assign) else \
            [node.target] if isinstance(node, ast.AnnAssign) else []
        if any(isinstance(t, ast.Name) and t.id == names[0] for t in targets):
            return True
    return False


def test_the_docs_cite_only_tests_that_exist():
    cited = {(path, match.group(1), match.group(2)) for path in [README, *PAGES]
             for match in CITED.finditer(path.read_text())}
    assert cited, "no test cited: the pattern no longer matches how the docs cite tests"
    gone = [f"{path.name}: tests/{name}{'::' + test if test else ''}"
            for path, name, test in sorted(cited) if not _defines(name, test)]
    assert not gone, "cited but not in tests/: " + "; ".join(gone)


def _defines(name: str, test: str | None) -> bool:
    source = ROOT / "tests" / name
    if not source.exists():
        return False
    return test is None or any(isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))
                               and node.name == test
                               for node in ast.walk(ast.parse(source.read_text())))


def test_the_readme_is_a_front_page_whose_links_lead_somewhere():
    text = README.read_text()
    assert len(text.splitlines()) <= FRONT_PAGE_LINES, "README.md is a front page: the " \
        "depth goes in docs/"
    targets = {target for target in LINK.findall(text) if "://" not in target}
    assert "docs/images/lanes.svg" in targets
    missing = sorted(target for target in targets if not (ROOT / target).exists())
    assert not missing, f"README.md links to files that do not exist: {missing}"


# --- README's own model, as written ---------------------------------------------------

def _readme_model() -> types.ModuleType:
    """README's ``mymodels.py``, run as module ``mymodels`` with its sleeps skipped."""
    blocks = re.findall(r"```python\n(# mymodels\.py\n.*?)```", README.read_text(), re.S)
    assert len(blocks) == 1, "README.md has one ```python block starting # mymodels.py"
    module = types.ModuleType("mymodels")
    exec(compile(blocks[0], "README.md:mymodels.py", "exec"), module.__dict__)
    module.time = types.SimpleNamespace(sleep=lambda seconds: None)
    return module


@pytest.fixture()
def mymodels(monkeypatch: pytest.MonkeyPatch):
    from tasks.jobs import catalog

    module = _readme_model()
    monkeypatch.setitem(sys.modules, "mymodels", module)
    catalog._resolve.cache_clear()
    with override(models={"mine": "mymodels:Mine"}, warm_models=("mine",)):
        yield module
    catalog._resolve.cache_clear()


def _run(model: Any, inputs: Any, stop_at: int | None = None,
         resume: tuple[int, Any] | None = None) -> tuple[Any, list[int], Any]:
    """``model.predict`` with a progress that records each step and, at ``stop_at``,
    raises as a preempted run's guard does; returns (output, steps, last state)."""
    seen: list[tuple[int, Any]] = []

    def progress(done: int, total: int | None = None, state: Any = None) -> None:
        seen.append((done, state))
        if done == stop_at:
            raise InterruptedError(done)

    try:
        output = model.predict(inputs, progress, **({"resume": resume} if resume else {}))
    except InterruptedError:
        output = None
    return output, [done for done, _ in seen], seen[-1][1] if seen else None


def test_the_readme_model_is_a_class_model_whose_bad_input_names_the_field(mymodels):
    from gpu_worker.models import is_predictor
    from tasks.jobs import catalog
    from tasks.jobs.schema import validate

    assert is_predictor(mymodels.Mine) and catalog.spec("mine").cls is mymodels.Mine
    assert mymodels.Mine.resumable
    assert dict(validate(model="mine", text="hello").inputs) == {"text": "hello", "steps": 20}
    for bad, field in (({"steps": 500}, "steps"), ({"colour": "red"}, "colour"),
                       ({"text": ""}, "text")):
        with pytest.raises(InvalidJob) as caught:
            validate(model="mine", **{"text": "hello", **bad})
        assert caught.value.field == field


def test_the_readme_model_returns_what_it_says_and_resumes_to_the_same(mymodels, tmp_path):
    from tasks.worker.execute import is_preemptible

    model = mymodels.Mine(device="cpu", model_dir=tmp_path)
    model.warmup()
    assert is_preemptible(model), "README.md says a resumable model is preemptible"
    said = re.search(r'text="hello", tier="fast"\)\n.*?\["output"\]\s*# (\{.*?\})\n',
                     README.read_text())
    assert said, "README.md shows the output of submit(model='mine', text='hello')"
    inputs = mymodels.MineInput(text="hello")
    whole, steps, _ = _run(model, inputs)
    assert whole == ast.literal_eval(said.group(1)) and steps == list(range(1, 21))
    cut, before, state = _run(model, inputs, stop_at=7)
    assert cut is None and before == list(range(1, 8))
    resumed, after, _ = _run(model, inputs, resume=(7, state))
    assert after == list(range(8, 21)) and resumed == whole
