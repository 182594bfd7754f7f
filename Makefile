# verl_laminar: one command to set up and run, one to set up and test (idempotent; venv in .venv, ignored by git).
PY := .venv/bin/python
PYTEST_ARGS ?=
DEMO_ARGS ?=

.PHONY: setup fixtures fixtures-learn demo test test-fast test-slow clean-shm

setup:
	bash scripts/setup.sh

# The tests' fixtures only: tiny-chain (the time-to-reward benchmark's, ~15 min to build) is built by
# `python -m verl_laminar.fixtures --fixture tiny-chain` or `make fixtures-learn`.
fixtures: setup
	$(PY) -m verl_laminar.fixtures --fixture tiny-qwen
	$(PY) -m verl_laminar.fixtures --fixture tiny-bpe

fixtures-learn: setup
	$(PY) -m verl_laminar.fixtures --fixture tiny-chain

# The main job: +laminar=enabled and verl's sync GRPO side by side on the CPU fixtures (the workload's steps, the
# paper-regime workload), one summary screen and the pictures; verl/vLLM output goes to runs/demo/<mode>.log.
# It builds only the fixture its workload needs (bench.e2e.ensure_model), not the tests' fixture.
demo: setup
	$(PY) -m verl_laminar.watchdog --limit-s 1800 -- $(PY) -m verl_laminar.bench.demo $(DEMO_ARGS)
	$(MAKE) clean-shm

# Everything CI runs: the linter (ruff, configured in pyproject.toml), unit, contract and the essential end-to-end
# tests (marker e2e). Long runs are marked slow.
test: fixtures
	$(PY) -m ruff check .
	$(PY) -X faulthandler -m pytest -m "not slow" --durations=30 $(PYTEST_ARGS) tests
	$(MAKE) clean-shm

test-fast: setup
	$(PY) -m pytest -m "not slow and not e2e" $(PYTEST_ARGS) tests

test-slow: fixtures fixtures-learn
	$(PY) -m pytest -m slow $(PYTEST_ARGS) tests

# vLLM's CPU engine leaves POSIX shared-memory queues behind when Ray kills it at shutdown.
clean-shm:
	$(PY) -m verl_laminar.platform.shm_cleanup
