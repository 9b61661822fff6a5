"""``python -m benchmarks.simulate [--validate | --autoscale]``: the simulator, its
validation, or its scalers compared on a day (``benchmarks.simulate.autoscale``).

``--validate`` runs a real local cluster against the simulator (its other options are
``benchmarks.simulate.validate``'s). It is decided before anything else is imported:
the validation points gpulanes at a private Redis, which must happen before the
project reads its settings.
"""
from __future__ import annotations

import sys


def main(argv: list[str] | None = None) -> int:
    """Dispatch to the simulator or to the validation."""
    argv = sys.argv[1:] if argv is None else list(argv)
    if "--autoscale" in argv:
        from benchmarks.simulate.autoscale import main as autoscale

        return autoscale([arg for arg in argv if arg != "--autoscale"])
    if "--validate" in argv:
        from benchmarks.simulate.validate import main as validate

        return validate([arg for arg in argv if arg != "--validate"])
    from benchmarks.simulate.cli import main as simulate

    return simulate(argv)


if __name__ == "__main__":
    sys.exit(main())
