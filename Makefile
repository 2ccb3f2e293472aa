# Two entry points on a fresh machine: `make demo` (the main job) and `make test`.
PY ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
export XLA_PYTHON_CLIENT_PREALLOCATE = false
# Python writes each module's bytecode (.pyc) at its first import, even where the machine sets
# PYTHONDONTWRITEBYTECODE (these do): pip installs without compiling (below), so otherwise
# every test process, and every trainer a test starts, compiles jax, flax, torch and
# transformers from source again (their import: 3.5 s with bytecode, 7 to 10 s without).
export PYTHONDONTWRITEBYTECODE =
# Huge pages for the host buffers XLA:CPU allocates at every call (jaxrl_frontier/core/host_memory.py;
# the entry points set this themselves): the test processes too, and the trainers they start.
# tests/models/test_pretrained.py took 102 s with it against 109 to 120 s without, here.
export GLIBC_TUNABLES ?= glibc.malloc.hugetlb=1

$(BIN)/python:
	$(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip

.PHONY: install install-test demo test lint format
# --no-compile: Python compiles a module's bytecode when it is first imported; compiling every
# installed file up front (torch and transformers hold tens of thousands) took more than half
# of a fresh install here (289 s against 126 s, the same packages).
install: $(BIN)/python
	$(BIN)/pip install -q --no-compile -e .

install-test: $(BIN)/python
	$(BIN)/pip install -q --no-compile -e '.[test]'

demo: install
	$(BIN)/python scripts/demo.py

lint: install-test
	$(BIN)/ruff check jaxrl_frontier scripts benchmarks configs sweeps tests
	$(BIN)/ruff format --check jaxrl_frontier scripts benchmarks configs sweeps tests
	$(BIN)/lint-imports

format:
	$(BIN)/ruff check --fix jaxrl_frontier scripts benchmarks configs sweeps tests
	$(BIN)/ruff format jaxrl_frontier scripts benchmarks configs sweeps tests

# One pytest process per test file, two at a time (tests/run_files.py): the suite is
# compile-bound, and XLA compiles one program on one core.
test: install-test lint
	$(BIN)/python tests/run_files.py --workers 2 tests benchmarks/tests
