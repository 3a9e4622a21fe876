# The two commands that matter: `make demo` and `make test`. Both set up everything they need.
SHELL := /bin/bash
.DEFAULT_GOAL := help
VENV = $(shell ./deploy/venv.sh)
PY = $(VENV)/bin/python
BENCHMARKS ?= train ingest freshness restart serving scaleout
export MLFLOW_DISABLE_TELEMETRY = true
export DO_NOT_TRACK = true
export FEAST_USAGE = False

.PHONY: help demo test faults unit check lint format lock bench clean

help:  ## list the targets
	@grep -E '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  make %-14s %s\n", $$1, $$2}'

demo:  ## run the whole online-learning loop in one process (embedded profile), about 5 minutes
	@venv=$(VENV); $$venv/bin/ctr demo --out runs/demo

test: services-up browser promtool  ## install everything, start Kafka/Redis/MLflow, run the whole test suite
	@venv=$(VENV); $$venv/bin/python -m pytest $(PYTEST_ARGS)

faults: services-up  ## fault injection and hostile input against the real services; prints the fault report
	@venv=$(VENV); $$venv/bin/python -m pytest -m faults $(PYTEST_ARGS)

unit:  ## only the fast tests (no services, nothing slow)
	@venv=$(VENV); $$venv/bin/python -m pytest -m "not integration and not slow" $(PYTEST_ARGS)

check:  ## ruff (lint + format check), mypy, the layers (import-linter), dead code (vulture), module size
	@venv=$(VENV); $$venv/bin/ruff check . && $$venv/bin/ruff format --check . && $$venv/bin/mypy && \
	$$venv/bin/lint-imports --no-cache && \
	$$venv/bin/vulture pipeline features trainers serving_bridge --min-confidence 80 --ignore-names revoked,explain && \
	find pipeline -name '*.py' -exec wc -l {} + | awk '$$2 != "total" && $$1 > 300 {print "over 300 lines (split it):", $$2, $$1; bad = 1} END {exit bad}'

format:  ## apply ruff's formatter and autofixes
	@venv=$(VENV); $$venv/bin/ruff format . && $$venv/bin/ruff check --fix .

lock:  ## recompile requirements.lock from requirements.in
	@venv=$(VENV); $$venv/bin/uv pip compile requirements.in -o requirements.lock --python-version 3.11 -q --no-header

bench: services-up vegeta  ## run every benchmark in benchmarks/ (train, ingest, freshness, restart, serving, scaleout; missing ones skipped)
	@venv=$(VENV); eval "$$(CTR_VENV=$$venv ./deploy/services.sh env)"; \
	for b in $(BENCHMARKS); do \
	  if [ -f benchmarks/$$b.py ]; then echo "== benchmarks/$$b.py"; $$venv/bin/python benchmarks/$$b.py || exit 1; \
	  else echo "== benchmarks/$$b.py: not present, skipped"; fi; \
	done

clean:  ## remove run outputs (not the cached venv)
	rm -rf runs .pytest_cache .mypy_cache .ruff_cache

.PHONY: services-up services-down services-status services-env browser promtool vegeta

promtool:  ## promtool from Debian's prometheus package, for the /metrics lint test (installed when missing)
	@./deploy/promtool.sh

vegeta:  ## vegeta (Go load generator) for benchmarks/serving.py, built from the Go module proxy when missing
	@./deploy/vegeta.sh >/dev/null

browser:  ## headless Chromium + chromedriver from Debian for the MLflow UI test (installed when missing)
	@./deploy/browser.sh

services-up:  ## start local Kafka (KRaft; its CLI in deploy/kafka/bin), Redis and the MLflow server; idempotent, health-checked
	@venv=$(VENV); CTR_VENV=$$venv ./deploy/services.sh up

services-down:  ## stop the local services (data stays in $CTR_STATE, default ~/.cache/ctr-online/state)
	@./deploy/services.sh down

services-status:  ## pid, health, URL and log of each local service
	@venv=$(VENV); CTR_VENV=$$venv ./deploy/services.sh status

services-env:  ## the exports for a shell: eval "$(make -s services-env)" (addresses as the config names them, Kafka's CLI on PATH)
	@./deploy/services.sh env
