"""The docs' benchmark pages say what the committed results say (``benchmarks/pages.py``)."""
from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

PROJECT_DIR = Path(__file__).resolve().parent.parent
PAGES = PROJECT_DIR / "docs" / "benchmarks"


def check(*args: str) -> subprocess.CompletedProcess:
    """``python benchmarks/pages.py --check`` with ``args``, as a process of its own."""
    return subprocess.run([sys.executable, "benchmarks/pages.py", "--check", *args],
                          cwd=PROJECT_DIR, capture_output=True, text=True, timeout=60)


def test_committed_pages_match_their_json() -> None:
    proc = check()
    assert proc.returncode == 0, proc.stderr + proc.stdout
    assert (PAGES / "index.md").exists()


def test_a_page_edited_by_hand_is_named_stale(tmp_path: Path) -> None:
    pages = tmp_path / "pages"
    shutil.copytree(PAGES, pages)
    edited = sorted(path for path in pages.glob("*.md") if path.name != "index.md")[0]
    edited.write_text(edited.read_text() + "\nA figure typed in by hand.\n")
    proc = check("--pages", str(pages))
    assert proc.returncode == 1, proc.stderr + proc.stdout
    assert edited.name in proc.stderr and "index.md" not in proc.stderr


def test_a_page_no_json_gives_and_a_missing_plot_are_named(tmp_path: Path) -> None:
    pages = tmp_path / "pages"
    shutil.copytree(PAGES, pages)
    (pages / "retired.md").write_text("# A benchmark that is gone\n")
    plot = sorted(pages.glob("*.png"))[0]
    plot.unlink()
    proc = check("--pages", str(pages))
    assert proc.returncode == 1
    assert "retired.md (no JSON gives it)" in proc.stderr
    assert f"{plot.name} (missing)" in proc.stderr
