# dankserve: `make up` sets up and starts the service; `make test` sets up and runs the checks.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed

.PHONY: setup system-deps lint base-install-check man test test-fast up demo try-it try-it-podman fake-vllm-image bench reliability reliability-quick clean docs catalogue

setup: $(STAMP)

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -e '.[test,cluster]'
	touch $(STAMP)

system-deps:
	bash scripts/system-deps.sh
	bash scripts/build-criu.sh

lint: setup
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy
	$(BIN)/python -m pytest -q -p no:cacheprovider tests/test_suite_rules.py  # the suite's rules about itself: seconds

# `pip install .` (no extras) into a fresh venv under build/, then one stand-in deployment through
# its `dankserve run` until ready and a clean stop: a runtime dependency missing from pyproject fails.
base-install-check:
	$(PYTHON) scripts/base_install_check.py

# The suite runs on TEST_WORKERS pytest-xdist workers (docs/TESTING.md: most tests wait on
# daemons, containers and sockets, so more workers than cores pay); TEST_WORKERS=0 runs it in one process.
TEST_WORKERS ?= 4
PYTEST_PARALLEL = -n $(TEST_WORKERS) --dist loadgroup

test: setup system-deps lint
	$(BIN)/python -m pytest $(PYTEST_PARALLEL)

test-fast: setup
	$(BIN)/python -m pytest $(PYTEST_PARALLEL) -m 'not podman and not journald and not slow'

# Checks the host first (`dankserve doctor`: every missing piece with its fix; make up stops there),
# installs the unit where systemd runs (a fresh install stops after writing the example config, to
# be reviewed first), then starts every configured deployment and follows it until ready.
CONFIG_FILE = $${DANKSERVE_CONFIG:-/etc/dankserve/dankserve.toml}
up: setup
	@$(BIN)/dankserve doctor || { echo "make up: stopped: dankserve doctor exited $$?: fix the [fail] lines above, then run make up again (docs/OPERATIONS.md)" >&2; exit 3; }
	@if [ "$$(id -u)" -eq 0 ] && [ -d /run/systemd/system ]; then \
	  fresh=$$([ -e "$(CONFIG_FILE)" ] || echo yes); \
	  $(BIN)/dankserve install || exit $$?; \
	  if [ -n "$$fresh" ]; then echo "make up: review the deployments in $(CONFIG_FILE) (an example), then run make up again"; exit 0; fi; \
	fi; \
	$(BIN)/dankserve up

# The whole flow on a machine without a GPU, with the stand-in vLLM (dankserve/demo.py): sets up
# stand-in GPUs, a private Podman service and the image, runs plan/up/kill/restart/status/down
# through the real CLI, prints a summary and removes what it set up.
demo: setup system-deps
	$(BIN)/python -m dankserve.demo

# Drive the daemon by hand on the stand-in (docs/TRY-IT.md): a private copy of config/try-it.toml (this user's
# directory, free ports) and the exports to run. try-it-podman: the same as containers, with stand-in GPUs (their
# device nodes and CDI spec) and a private Podman service, kept until Ctrl-C (root; dankserve/testing/try_it.py).
try-it: setup
	$(BIN)/python -m dankserve.testing.try_it

try-it-podman: setup system-deps
	$(BIN)/python -m dankserve.testing.try_it --podman

# Regenerate dankserve/data/vllm_catalogue.json and containers/fake-vllm/vllm_args_0.{33,34}.json
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

# Man pages rendered from the commands' help, into build/man (`dankserve install`, run by
# `make up`, installs the same pages into /usr/local/share/man/man1).
man: setup
	$(BIN)/python scripts/gen_man_pages.py build/man

docs: setup
	$(BIN)/python scripts/gen_config_reference.py
	$(BIN)/python scripts/gen_exit_codes.py
	$(BIN)/python scripts/gen_state_table.py --write docs/ARCHITECTURE.md
