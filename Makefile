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
	$(BIN)/ruff check jaxrl_frontier scripts configs tests
	$(BIN)/ruff format --check jaxrl_frontier scripts configs tests

format:
	$(BIN)/ruff check --fix jaxrl_frontier scripts configs tests
	$(BIN)/ruff format jaxrl_frontier scripts configs tests

# Two pytest processes, each half the files: one process holding every test's compiled
# programs and run threads for 15 minutes is what a CPU machine handles worst.
test: install-test lint
	$(BIN)/python -m pytest -q tests/test_[a-r]*.py
	$(BIN)/python -m pytest -q tests/test_[s-z]*.py
