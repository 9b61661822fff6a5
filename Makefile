# Two commands: `make demo` and `make test`. Both create .venv themselves.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
# Pinned so that pip takes a local CPU build where one is offered, and the
# stock wheel (CUDA on Linux) on a GPU host.
TORCH ?= torch==2.13.0
STAMP := $(VENV)/.installed-stamp

.PHONY: demo test bench clean

$(STAMP): setup.cfg pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --disable-pip-version-check "$(TORCH)"
	$(PY) -m pip install --quiet --disable-pip-version-check -e ".[test]"
	touch $@

demo: $(STAMP)
	$(PY) -m tasks.demo

test: $(STAMP)
	$(PY) -m pytest

bench: $(STAMP)
	$(PY) benchmarks/lanes.py
	$(PY) benchmarks/submit.py
	$(PY) benchmarks/fairness.py
	$(PY) benchmarks/overload.py
	$(PY) benchmarks/coldstart.py
	$(PY) benchmarks/affinity.py
	$(PY) benchmarks/cache.py

clean:
	rm -rf $(VENV) .gpulanes artifacts build *.egg-info
