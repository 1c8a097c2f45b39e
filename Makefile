# Set-up is part of every target: a fresh machine needs only Python 3.11+, pip and a C compiler.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: run test lint bench

$(STAMP): requirements.lock pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --require-hashes -r requirements.lock
	$(BIN)/pip install --quiet --no-deps -e .
	touch $(STAMP)

# The main job on its embedded default.
run: $(STAMP)
	$(BIN)/harness demo

# The whole test suite; PostgreSQL tests run when HARNESS_TEST_POSTGRES_URL is set.
test: $(STAMP)
	$(BIN)/pytest

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/mypy

bench: $(STAMP)
	$(BIN)/python bench/journal.py
