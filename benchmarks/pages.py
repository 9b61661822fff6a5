"""``python benchmarks/pages.py [--check]``: the docs' benchmark pages from their JSON.

Every ``docs/results/<name>.json`` a benchmark wrote becomes ``docs/benchmarks/<name>.md``
(what was measured, its tables, PNG plots where a plot says more, the run's stamp) and a
row of ``docs/benchmarks/index.md``. ``--check`` draws nothing: it exits 1 naming every
page whose committed markdown differs from what the JSON gives (or whose plot is missing).
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any, Callable

if not __package__:  # run as a script: make the project importable
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.common import RESULTS, ROOT  # noqa: E402
from benchmarks.pages_kit import Page, generic, run_block, short_stamp, table  # noqa: E402
from benchmarks.api_page import RENDERERS as API  # noqa: E402
from benchmarks.pages_autoscale import RENDERERS as AUTOSCALE  # noqa: E402
from benchmarks.pages_capacity import RENDERERS as CAPACITY  # noqa: E402
from benchmarks.pages_fair import RENDERERS as FAIR  # noqa: E402
from benchmarks.pages_load import RENDERERS as LOAD  # noqa: E402
from benchmarks.pages_paths import RENDERERS as PATHS  # noqa: E402
from benchmarks.pages_sim import RENDERERS as SIM  # noqa: E402
from benchmarks.pages_store import RENDERERS as STORE  # noqa: E402

PAGES = ROOT / "docs" / "benchmarks"
#: JSON name -> its page
RENDERERS: dict[str, Callable[[dict[str, Any]], Page]] = {**PATHS, **LOAD, **FAIR, **STORE,
                                                          **SIM, **API, **AUTOSCALE,
                                                          **CAPACITY}
#: the index's order: the job's path, a busy pool, models, the fleet, Redis' guarantees
ORDER = ("lanes", "submit", "api", "perjob", "overload", "fairness", "lane_fairness",
         "preempt", "affinity", "coldstart", "cache", "models", "batching", "estimate",
         "fleet", "redis_capacity", "simulate", "simulate_10000", "simulate_flood", "autoscale", "autoscale_sim", "durability", "failover")
INTRO = """\
# Benchmarks

Each benchmark runs gpulanes and its baseline side by side in one run on the same
machine and reports ratios: the baseline is plain Celery (a separate default Celery
app in its own process, kombu's stock Redis transport) where there is one to compare
with, otherwise the simpler way named on the page. The figures below come from the
JSON each benchmark writes to `docs/results/`; on a shared machine expect ±10% from
run to run, so read the ratios rather than the absolute times.

Run a benchmark (`python benchmarks/<name>.py`, or `make bench` for all of them),
then `python benchmarks/pages.py` to rewrite these pages from its JSON.
"""


def load(folder: Path = RESULTS) -> dict[str, dict[str, Any]]:
    """Every result JSON in ``folder`` by name; a list (older files) under ``runs``."""
    found = {}
    for path in sorted(folder.glob("*.json")):
        data = json.loads(path.read_text())
        found[path.stem] = data if isinstance(data, dict) else {"runs": data}
    return found


def render(results: dict[str, dict[str, Any]]) -> list[tuple[Page, dict[str, Any]]]:
    """A page per result, in the index's order; one without a layout of its own lists its
    figures."""
    names = [name for name in ORDER if name in results] + sorted(set(results) - set(ORDER))
    return [(RENDERERS[name](results[name]) if name in RENDERERS
             else generic(name, results[name]), results[name]) for name in names]


def page_markdown(page: Page, data: dict[str, Any]) -> str:
    """A benchmark's whole page."""
    source = (f"Figures from [`docs/results/{page.name}.json`](../results/{page.name}.json), "
              "rendered by `python benchmarks/pages.py`.")
    blocks = [f"# {page.title}", page.about, *page.sections, run_block(data.get("meta")),
              source]
    return "\n\n".join(block.strip("\n") for block in blocks) + "\n"


def index_markdown(rendered: list[tuple[Page, dict[str, Any]]]) -> str:
    """The index: every benchmark with its headline, its ratio and its run."""
    rows = [(f"[{page.title}]({page.name}.md)", page.headline, page.versus,
             short_stamp(data.get("meta"))) for page, data in rendered]
    body = table(("benchmark", "headline", "against the baseline", "run"), rows, "llll")
    return INTRO + "\n" + body + "\n"


def expected(rendered: list[tuple[Page, dict[str, Any]]], pages: Path) -> dict[Path, str]:
    """Every markdown file of ``pages`` and its text."""
    files = {pages / "index.md": index_markdown(rendered)}
    files.update({pages / f"{page.name}.md": page_markdown(page, data)
                  for page, data in rendered})
    return files


def shown(path: Path) -> str:
    """``path`` relative to the project when it lies inside it."""
    return str(path.relative_to(ROOT)) if path.is_relative_to(ROOT) else str(path)


def stale(files: dict[Path, str], plots: list[Path], pages: Path) -> list[str]:
    """What differs from ``files``: changed, missing and extra pages, missing plots."""
    found = [shown(path) for path, text in files.items()
             if not path.exists() or path.read_text() != text]
    found += [shown(path) + " (no JSON gives it)"
              for path in sorted(pages.glob("*.md")) if path not in files]
    return found + [shown(path) + " (missing)" for path in plots if not path.exists()]


def write(files: dict[Path, str], rendered: list[tuple[Page, dict[str, Any]]],
          pages: Path) -> None:
    """Write every page and draw every plot; pages and plots no JSON gives are removed."""
    from benchmarks.pages_plot import save

    pages.mkdir(parents=True, exist_ok=True)
    plots = [plot for page, _ in rendered for plot in page.plots]
    keep = set(files) | {pages / plot.file for plot in plots}
    for path in [*pages.glob("*.md"), *pages.glob("*.png")]:
        if path not in keep:
            path.unlink()
    for path, text in files.items():
        path.write_text(text)
    for plot in plots:
        save(plot, pages / plot.file)


def main(argv: list[str] | None = None) -> int:
    """Rewrite the pages, or with ``--check`` say which are stale (exit 1)."""
    parser = argparse.ArgumentParser(prog="python benchmarks/pages.py", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--check", action="store_true",
                        help="write nothing; exit 1 naming each stale page")
    parser.add_argument("--results", type=Path, default=RESULTS, metavar="DIR",
                        help="the JSON (default: docs/results)")
    parser.add_argument("--pages", type=Path, default=PAGES, metavar="DIR",
                        help="the pages (default: docs/benchmarks)")
    args = parser.parse_args(argv)
    rendered = render(load(args.results))
    files = expected(rendered, args.pages)
    if args.check:
        plots = [args.pages / plot.file for page, _ in rendered for plot in page.plots]
        found = stale(files, plots, args.pages)
        for line in found:
            print(f"stale: {line}; run python benchmarks/pages.py", file=sys.stderr)
        return 1 if found else 0
    write(files, rendered, args.pages)
    print(f"wrote {len(files)} pages to {shown(args.pages)}/")
    return 0


if __name__ == "__main__":
    sys.exit(main())
