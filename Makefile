# Planner developer tasks. On a fresh machine with Python 3.11, `make run` and
# `make test` bootstrap the virtualenv by themselves.

PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

PLANNER_CONFIG ?= examples/planner.yaml
export PLANNER_CONFIG

PYTEST_ARGS ?=

.PHONY: all run serve test bench lint openapi clean

all: test

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -e '.[dev]'
	touch $@

# The demo: the service against a simulated cluster replaying the bundled Azure trace
# (extra flags: make run DEMO_ARGS='--speed 20').
DEMO_TRACE ?= data/traces/AzureLLMInferenceTrace_conv.csv
DEMO_ARGS ?=

run: $(STAMP)
	$(BIN)/planner demo --trace $(DEMO_TRACE) $(DEMO_ARGS)

# The service on $(SERVE_CONFIG) (deployment `demo` under SLA scaling) and, beside it, a stand-in
# frontend on 127.0.0.1:8090 playing the bundled trace on the wall clock for it to decide on.
# Ctrl-C stops both.
SERVE_CONFIG ?= examples/serve.yaml

serve: $(STAMP)
	@$(BIN)/python -m app.sim.demo.standin --port 8090 & standin=$$!; \
	trap 'kill $$standin 2>/dev/null' EXIT; trap 'exit 0' INT TERM; \
	PLANNER_CONFIG=$(SERVE_CONFIG) $(BIN)/planner serve

test: $(STAMP)
	$(BIN)/python -m pytest $(PYTEST_ARGS)

bench: $(STAMP)
	@set -e; for f in bench/*.py; do \
		[ -e "$$f" ] || continue; \
		name=$$(basename "$$f" .py); \
		[ "$$name" != __init__ ] || continue; \
		echo "== python -m bench.$$name"; \
		$(BIN)/python -m "bench.$$name"; \
	done

lint: $(STAMP)
	$(BIN)/ruff check app tests bench deploy

# NVIDIA Dynamo 1.6.1 in its own venv, .venv-dynamo, for bench/dynamo_replay.py (docs/benchmarks.md)
# and the live stack (deploy/dynamo-local/, make run-dynamo).
.PHONY: dynamo-venv run-dynamo
dynamo-venv:
	bash bench/install_dynamo.sh

# The planner steering a live Dynamo stack: the real frontend and mocker workers on loopback, the
# service and an orchestrator that starts and drains workers (extra flags: DYNAMO_ARGS='--load none').
DYNAMO_ARGS ?=
run-dynamo: $(STAMP)
	@test -x .venv-dynamo/bin/python || { echo "Dynamo's venv is missing: make dynamo-venv"; exit 1; }
	PYTHONPATH=$(CURDIR) $(BIN)/python deploy/dynamo-local/run.py $(DYNAMO_ARGS)

openapi: $(STAMP)
	$(BIN)/planner openapi

clean:
	rm -rf $(VENV) .pytest_cache .ruff_cache build dist *.egg-info
	find . -path ./.git -prune -o -type d -name __pycache__ -prune -exec rm -rf {} +
	rm -f ./*.db
