# Two entry points on a fresh machine: `make demo` (the main job) and `make test`.
PY ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
export XLA_PYTHON_CLIENT_PREALLOCATE = false

$(BIN)/python:
	$(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip

.PHONY: install install-test demo test lint format
install: $(BIN)/python
	$(BIN)/pip install -q -e .

install-test: $(BIN)/python
	$(BIN)/pip install -q -e '.[test]'

demo: install
	$(BIN)/python scripts/demo.py

lint: install-test
	$(BIN)/ruff check jaxrl_frontier scripts benchmarks configs tests
	$(BIN)/ruff format --check jaxrl_frontier scripts benchmarks configs tests
	$(BIN)/lint-imports

format:
	$(BIN)/ruff check --fix jaxrl_frontier scripts benchmarks configs tests
	$(BIN)/ruff format jaxrl_frontier scripts benchmarks configs tests

# Two pytest-xdist workers, each a process of its own with whole test files (`loadfile`):
# the suite is compile-bound, and XLA compiles one program on one core.
test: install-test lint
	$(BIN)/python -m pytest -q -n 2 --dist loadfile --no-loadscope-reorder --durations=25 tests
