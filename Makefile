# dankserve: `make up` sets up and starts the service; `make test` sets up and runs the checks.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed

.PHONY: setup system-deps lint test test-fast up demo fake-vllm-image bench reliability clean docs

setup: $(STAMP)

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -e '.[test]'
	touch $(STAMP)

system-deps:
	bash scripts/system-deps.sh

lint: setup
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy

test: setup system-deps lint
	$(BIN)/python -m pytest

test-fast: setup
	$(BIN)/python -m pytest -m 'not podman and not journald and not slow'

up: setup
	$(BIN)/dankserve up

bench: setup
	$(BIN)/python bench/run_all.py

fake-vllm-image:
	bash containers/build-image.sh

clean:
	rm -rf $(VENV) .mypy_cache .ruff_cache .pytest_cache build *.egg-info
