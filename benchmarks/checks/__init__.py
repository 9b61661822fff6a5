"""The benchmarks' own tests (the simulator, the overload benchmark's pace and figures):
pure, no cluster; ``make test`` runs them with the suite."""
