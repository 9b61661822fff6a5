"""What the tests, the soak suites (``tests/soak``) and the benchmarks share: a private
cluster's environment, the fault harness, tables. Nothing here imports ``tasks`` at
module level: it reads its settings once, at import, so :func:`private.private_env`
must run first."""
