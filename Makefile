# Two commands: `make demo` and `make test`. Both create .venv themselves.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
# Pinned so that pip takes a local CPU build where one is offered, and the
# stock wheel (CUDA on Linux) on a GPU host.
TORCH ?= torch==2.13.0
STAMP := $(VENV)/.installed-stamp

.PHONY: demo test docs browser bench gpu-check soak clean

$(STAMP): setup.cfg pyproject.toml requirements-models.txt
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --disable-pip-version-check "$(TORCH)"
	$(PY) -m pip install --quiet --disable-pip-version-check -e ".[test]"
	$(PY) -m pip install --quiet --disable-pip-version-check --no-deps --require-hashes \
		-r requirements-models.txt
	touch $@

demo: $(STAMP)
	$(PY) -m tasks.dev.demo

# The layer contracts (setup.cfg, import-linter) first: a broken one fails in a second.
# Tests run in TEST_JOBS processes, a file to each at a time; each process has its own
# embedded Redis and state folder (tests/conftest.py). TEST_JOBS=0 runs them in one.
# Most of a test's time is spent waiting on its cluster's processes, so one process more
# than a 2-core machine's cores keeps both cores busy.
TEST_JOBS ?= 3
test: $(STAMP) browser
	$(VENV)/bin/lint-imports
	$(MKDOCS) --quiet
	$(PY) -m pytest -n $(TEST_JOBS) --dist loadfile

# The documentation site (mkdocs.yml, docs/) into site/; strict: a broken link or
# anchor fails the build, and with it `make test` (a few seconds).
MKDOCS := NO_MKDOCS_2_WARNING=1 $(VENV)/bin/mkdocs build --strict
docs: $(STAMP)
	$(MKDOCS)

# Debian's Chromium and ChromeDriver for the Flower browser test
# (tests/test_flower_browser.py). Installed only when missing, and only as root
# with apt-get (CI); elsewhere that test skips and says why. The package lists
# are refreshed only when the install cannot find the packages without it.
CHROMIUM ?= /usr/bin/chromium
CHROMEDRIVER ?= /usr/bin/chromedriver
APT_BROWSER := DEBIAN_FRONTEND=noninteractive apt-get install -y -qq \
	--no-install-recommends chromium chromium-driver
browser:
	@if [ -x $(CHROMIUM) ] && [ -x $(CHROMEDRIVER) ]; then :; \
	elif [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
		echo "installing Debian's chromium and chromium-driver for the browser test"; \
		$(APT_BROWSER) >/dev/null 2>&1 \
		|| { apt-get update -qq && $(APT_BROWSER) >/dev/null; }; \
	else \
		echo "no $(CHROMIUM) or $(CHROMEDRIVER), and not root with apt-get:" \
		     "the Flower browser test will skip"; \
	fi

bench: $(STAMP)
	$(PY) benchmarks/lanes.py
	$(PY) benchmarks/submit.py
	$(PY) benchmarks/api.py
	$(PY) benchmarks/perjob.py
	$(PY) benchmarks/fairness.py
	$(PY) benchmarks/lane_fairness.py
	$(PY) benchmarks/overload.py
	$(PY) benchmarks/coldstart.py
	$(PY) benchmarks/affinity.py
	$(PY) benchmarks/cache.py
	$(PY) benchmarks/batching.py
	$(PY) benchmarks/models.py
	$(PY) benchmarks/estimate.py
	$(PY) benchmarks/preempt.py
	$(PY) benchmarks/fleet.py --processes 64
	$(PY) -m benchmarks.simulate
	$(PY) benchmarks/pages.py

# The CUDA path on a GPU host (at most 8 minutes): pinned workers, shards on the device,
# batching, cold against warm, preemption, out-of-memory handling.
gpu-check: $(STAMP)
	$(PY) benchmarks/gpu.py --device cuda

# The long part of the reliability suite (minutes; tests/soak, which `make test` leaves
# out): faults (kills, freezes, Redis down and frozen, a full artifact disk, jobs several
# times their lease's life, with the default timeouts), Redis refusing writes
# (out of memory, MISCONF), Redis failing over under Sentinel (killed, frozen 5 s and
# 40 s, replicas tens of MB behind), what fsyncing and replicating each accepted job
# costs a submit (these two measured, in benchmarks/), then a 20,000-job burst. Each
# prints its table and exits non-zero if a job was lost, falsely failed, run twice, or
# a bound broken.
soak: $(STAMP)
	$(PY) tests/soak/faults.py
	$(PY) tests/soak/refusals.py
	$(PY) benchmarks/failover.py
	$(PY) benchmarks/durability.py
	$(PY) tests/soak/load.py --max-depth 500,2000,4000

clean:
	rm -rf $(VENV) .gpulanes artifacts build *.egg-info
