# slurm-qualify: `make help` lists the targets.
SHELL := /bin/bash
VENV ?= .venv
PY := $(VENV)/bin/python
QUALIFY := $(VENV)/bin/qualify
SWEEP ?=
ARGS ?=
WAIT ?=
HOST ?= 127.0.0.1
PORT ?= 5000
BACKEND ?= sqlite:///$(CURDIR)/mlruns.db
PYTEST_ARGS ?=

.DEFAULT_GOAL := help
.PHONY: help install sweep fit status report baseline ui mlflow-server discover sync test test-fast lint format typecheck bench cluster-install cluster-up cluster-down cluster-logs clean

help: ## list the targets
	@grep -hE '^[a-zA-Z_-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  \033[1m%-15s\033[0m %s\n", $$1, $$2}'
	@echo "  variables: SWEEP=<preset or sweep id>  ARGS='<hydra overrides>'  WAIT=1  PORT=5000"

$(VENV)/.installed: pyproject.toml scripts/install.sh
	@bash scripts/install.sh

install: $(VENV)/.installed ## create the venv and install (CPU torch when there is no GPU)

sweep: $(VENV)/.installed ## run a sweep preset (SWEEP=default); Slurm when it answers, else local
	$(QUALIFY) sweep --sweep $(or $(SWEEP),default) $(if $(WAIT),--wait) $(ARGS)

fit: $(VENV)/.installed ## memory per term, verdict and largest micro-batch of each point (nothing submitted)
	$(QUALIFY) fit --sweep $(or $(SWEEP),default) $(ARGS)

status: $(VENV)/.installed ## live table of a sweep by state and partition (SWEEP=<id>, default latest)
	$(QUALIFY) status $(if $(SWEEP),--sweep $(SWEEP)) --follow

report: $(VENV)/.installed ## decision record of a sweep, HTML + Markdown (SWEEP=<id>; ARGS='--compare <id>')
	$(QUALIFY) report $(if $(SWEEP),--sweep $(SWEEP)) $(ARGS)

baseline: $(VENV)/.installed ## write references from a sweep's accepted runs (SWEEP=<id>)
	$(QUALIFY) baseline $(if $(SWEEP),--sweep $(SWEEP)) $(ARGS)

ui: $(VENV)/.installed ## MLflow UI on http://$(HOST):$(PORT) over the project's store
	$(VENV)/bin/mlflow ui --backend-store-uri $(BACKEND) --host $(HOST) --port $(PORT)

mlflow-server: $(VENV)/.installed ## tracking server for many concurrent jobs (BACKEND=sqlite:///... or postgresql://...)
	$(VENV)/bin/mlflow server --backend-store-uri $(BACKEND) --host $(HOST) --port $(PORT) \
	  --artifacts-destination $(CURDIR)/mlartifacts --serve-artifacts

discover: $(VENV)/.installed ## write conf/partition stubs from this cluster's sinfo/scontrol
	$(QUALIFY) discover $(ARGS)

sync: $(VENV)/.installed ## replay tracking ledgers kept while MLflow was down (SWEEP=<id>)
	$(QUALIFY) sync runs/$(or $(SWEEP),$$(ls runs | tail -1))

test: $(VENV)/.installed ## all tests this machine can run (starts the local Slurm when it is installed)
	@bash scripts/test.sh $(PYTEST_ARGS)

test-fast: $(VENV)/.installed ## unit tests only (no multi-process, Slurm or browser tests)
	$(PY) -m pytest -q -m "not slow and not slurm and not gpu and not browser" $(PYTEST_ARGS)

lint: $(VENV)/.installed ## ruff (lint + format check) and mypy
	$(VENV)/bin/ruff check pipeline analysis tests benchmarks
	$(VENV)/bin/ruff format --check pipeline analysis tests benchmarks
	$(VENV)/bin/mypy

format: $(VENV)/.installed ## ruff format + autofix
	$(VENV)/bin/ruff format pipeline analysis tests benchmarks
	$(VENV)/bin/ruff check --fix pipeline analysis tests benchmarks

typecheck: $(VENV)/.installed ## mypy only
	$(VENV)/bin/mypy

bench: $(VENV)/.installed ## run every benchmark (prints figures and ratios)
	@for b in benchmarks/bench_*.py; do echo "== $$b"; $(PY) $$b || exit 1; done

cluster-install: ## apt-get install the local Slurm (munge, MariaDB, slurmdbd, slurmctld, slurmd)
	bash cluster/cluster.sh install

cluster-up: ## start a real Slurm on localhost (fake a100/h100/h200 partitions)
	bash cluster/cluster.sh up

cluster-down: ## stop the local Slurm
	bash cluster/cluster.sh down

cluster-logs: ## tails of every Slurm daemon log
	bash cluster/cluster.sh logs

clean: ## remove runs, the local MLflow store and caches (not the venv)
	rm -rf runs mlruns.db mlartifacts .pytest_cache .mypy_cache .ruff_cache
