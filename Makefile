# The two commands users need: `make demo` and `make test`.
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed

.PHONY: setup demo test test-slow bench clean

setup: $(STAMP)

# Torch first, pinned exactly: this takes the CPU wheel; a range would pull CUDA.
$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet torch==2.13.0
	$(PY) -m pip install --quiet -e '.[dev]'
	touch $(STAMP)

demo: setup
	$(VENV)/bin/circuitlab demo --out runs/demo

test: setup
	$(PY) -m pytest

test-slow: setup
	$(PY) -m pytest -m slow

bench: setup
	$(PY) benchmarks/bench_model.py

clean:
	rm -rf $(VENV) runs .pytest_cache
