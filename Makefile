# Planner developer tasks. On a fresh machine with Python 3.11, `make run` and
# `make test` bootstrap the virtualenv by themselves.

PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

PLANNER_CONFIG ?= examples/planner.yaml
export PLANNER_CONFIG

PYTEST_ARGS ?=

.PHONY: all run test bench lint openapi clean

all: test

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -e '.[dev]'
	touch $@

run: $(STAMP)
	$(BIN)/planner serve

test: $(STAMP)
	$(BIN)/python -m pytest $(PYTEST_ARGS)

bench: $(STAMP)
	@set -e; for f in bench/*.py; do \
		[ -e "$$f" ] || continue; \
		echo "== $$f"; \
		$(BIN)/python "$$f"; \
	done

lint: $(STAMP)
	$(BIN)/ruff check app tests bench

openapi: $(STAMP)
	$(BIN)/planner openapi

clean:
	rm -rf $(VENV) .pytest_cache .ruff_cache build dist *.egg-info
	find . -path ./.git -prune -o -type d -name __pycache__ -prune -exec rm -rf {} +
	rm -f ./*.db
