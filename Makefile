# dankserve: `make up` sets up and starts the service; `make test` sets up and runs the checks.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed

.PHONY: setup system-deps lint test test-fast up demo fake-vllm-image bench reliability reliability-quick clean docs catalogue

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

# Checks the host first (stopping at the first missing piece with its fix), installs the unit
# where systemd runs, then starts every configured deployment and follows it until ready.
up: setup
	@$(BIN)/dankserve doctor
	@if [ "$$(id -u)" -eq 0 ] && [ -d /run/systemd/system ]; then $(BIN)/dankserve install; fi
	$(BIN)/dankserve up

# Regenerate dankserve/data/vllm_catalogue.json and containers/fake-vllm/vllm_args_0.33.json
# from the vLLM wheels on PyPI (by hand, never in CI: the outputs are committed).
catalogue: setup
	$(BIN)/python scripts/gen_vllm_catalogue.py

bench: setup
	$(BIN)/python bench/run_all.py

fake-vllm-image:
	bash containers/build-image.sh

# The fault-injection suite (tests/reliability, marker `reliability`; `make test` leaves it out): real Podman,
# the stand-in image, each fault repeated. Writes the counts to docs/RELIABILITY.md even when something was
# lost, then fails if anything was. reliability-quick: smaller counts (CI), report under build/ only.
RELIABILITY_RESULTS ?= build/reliability
reliability: setup system-deps
	rm -rf $(RELIABILITY_RESULTS)
	DANKSERVE_RELIABILITY_RESULTS=$(RELIABILITY_RESULTS) $(BIN)/python -m pytest -m reliability tests/reliability; \
	rc=$$?; $(BIN)/python scripts/reliability_report.py $(RELIABILITY_RESULTS) docs/RELIABILITY.md; exit $$rc

reliability-quick: setup system-deps
	rm -rf build/reliability-quick
	DANKSERVE_RELIABILITY_QUICK=1 DANKSERVE_RELIABILITY_RESULTS=build/reliability-quick \
	$(BIN)/python -m pytest -m reliability tests/reliability; \
	rc=$$?; $(BIN)/python scripts/reliability_report.py build/reliability-quick build/reliability-quick/RELIABILITY.md; \
	exit $$rc

clean:
	rm -rf $(VENV) .mypy_cache .ruff_cache .pytest_cache build *.egg-info

docs: setup
	$(BIN)/python scripts/gen_config_reference.py
