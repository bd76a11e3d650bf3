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
MLFLOW_BACKEND ?= sqlite
WORKERS ?= 4
PYTEST_ARGS ?=
ifeq ($(origin BACKEND),undefined)
BACKEND := sqlite:///$(CURDIR)/mlruns.db
endif
# ARGS, SWEEP, WAIT, HOST, PORT, WORKERS and the backends reach their commands as typed: make hands their
# raw text over in the environment ($(value X): never expanded by make, never spliced into a
# recipe, so neither make nor the recipe shell expands `$` or runs backticks or $(shell ...)),
# and `qualify --args-from-env SQ_ARGS` splits ARGS into words like a shell without expanding
# anything. Quote ARGS for your own shell: make sweep ARGS='a=1 b=$$x'. Recipes test these
# variables with $(value X) too: $(X) would run make code the user typed.
export SQ_ARGS = $(value ARGS)
export SQ_SWEEP = $(value SWEEP)
export SQ_WAIT = $(value WAIT)
export SQ_HOST = $(value HOST)
export SQ_PORT = $(value PORT)
export SQ_BACKEND = $(value BACKEND)
export SQ_MLFLOW_BACKEND = $(value MLFLOW_BACKEND)
export SQ_WORKERS = $(value WORKERS)
# make exports a variable given on its command line to every recipe, expanding it first (that
# ran SWEEP='$(shell ...)' once per recipe): these reach recipes only as the SQ_ copies above
unexport ARGS SWEEP WAIT HOST PORT BACKEND MLFLOW_BACKEND WORKERS
# The venv's tools first, for every recipe and every job it starts: DeepSpeed's C++ ops are
# built at install time with the venv's ninja (scripts/prebuild_ops.py), and the system's ninja
# would rebuild them in the first job (the two invalidate each other's build cache).
export PATH := $(abspath $(VENV))/bin:$(PATH)
# ... and kept in the venv's own cache (not ~/.cache/torch_extensions, shared by every checkout:
# one venv's build there makes another's stale); every job sets it too (pipeline.job.startup)
export TORCH_EXTENSIONS_DIR := $(or $(realpath $(VENV)),$(abspath $(VENV)))/torch_extensions

.DEFAULT_GOAL := help
.PHONY: help install lock sweep status cancel resume report launch baseline ui fit mlflow-server postgres-up postgres-down discover sync test test-fast lint format typecheck bench cluster-install cluster-up cluster-down cluster-logs clean

help: ## list the targets
	@grep -hE '^[a-zA-Z_-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  \033[1m%-15s\033[0m %s\n", $$1, $$2}'
	@echo "  variables: SWEEP=<preset or sweep id>  ARGS='<hydra overrides>'  WAIT=1  PORT=5000"

$(VENV)/.installed: pyproject.toml requirements.lock scripts/install.sh
	@bash scripts/install.sh

install: $(VENV)/.installed ## create the venv and install from requirements.lock (CPU torch when there is no GPU)

lock: $(VENV)/.installed ## resolve requirements.lock again from pyproject.toml (every version and hash; torch from the lock's header, TORCH_VERSION=... to move it)
	VENV=$(VENV) bash scripts/lock.sh

sweep: $(VENV)/.installed ## run a sweep preset (SWEEP=default); Slurm when it answers, else local
	@bash scripts/interruptible.sh $(QUALIFY) sweep --sweep "$${SQ_SWEEP:-default}" $(if $(value WAIT),--wait) --args-from-env SQ_ARGS

fit: $(VENV)/.installed ## memory per term, verdict and largest micro-batch of each point (nothing submitted)
	$(QUALIFY) fit --sweep "$${SQ_SWEEP:-default}" --args-from-env SQ_ARGS

status: $(VENV)/.installed ## live table of a sweep by state and partition (SWEEP=<id>, default latest)
	@bash scripts/interruptible.sh $(QUALIFY) status $(if $(value SWEEP),--sweep "$$SQ_SWEEP") --follow

cancel: $(VENV)/.installed ## cancel what still runs of a sweep; its points end cancelled (SWEEP=<id>, default latest)
	$(QUALIFY) cancel $(if $(value SWEEP),--sweep "$$SQ_SWEEP")

resume: $(VENV)/.installed ## run again the points that ended for reasons outside the candidate, from their checkpoints (SWEEP=<id>; ARGS='--only <reasons>')
	$(QUALIFY) resume $(if $(value SWEEP),--sweep "$$SQ_SWEEP") --args-from-env SQ_ARGS

report: $(VENV)/.installed ## decision record of a sweep, HTML + Markdown (SWEEP=<id>; ARGS='--compare <id>')
	$(QUALIFY) report $(if $(value SWEEP),--sweep "$$SQ_SWEEP") --args-from-env SQ_ARGS

launch: $(VENV)/.installed ## the winner's production job, runs/<id>/launch/<candidate>/ (SWEEP=<id>; ARGS='project.tokens=2e10 project.gpus=64 [--candidate C] [--smoke 20]')
	$(QUALIFY) launch $(if $(value SWEEP),--sweep "$$SQ_SWEEP") --args-from-env SQ_ARGS

baseline: $(VENV)/.installed ## write references from a sweep's accepted runs (SWEEP=<id>)
	$(QUALIFY) baseline $(if $(value SWEEP),--sweep "$$SQ_SWEEP") --args-from-env SQ_ARGS

ui: $(VENV)/.installed ## MLflow UI on http://HOST:PORT (127.0.0.1:5000) over the project's store; prints the URL of the sweep's runs table (SWEEP=<id>, default latest)
	@$(QUALIFY) ui-url --host "$$SQ_HOST" --port "$$SQ_PORT" $(if $(value SWEEP),--sweep "$$SQ_SWEEP") || true
	bash scripts/mlflow_ui.sh "$(VENV)"

mlflow-server: $(VENV)/.installed ## tracking server for many jobs (BACKEND=sqlite|postgres|<URI>; basic auth off loopback; WORKERS=4)
	VENV=$(VENV) HOST="$$SQ_HOST" PORT="$$SQ_PORT" BACKEND="$$SQ_MLFLOW_BACKEND" WORKERS="$$SQ_WORKERS" bash scripts/mlflow_server.sh

postgres-up: ## start the project's PostgreSQL for the tracking server (127.0.0.1; .cluster/pg)
	bash cluster/postgres.sh up

postgres-down: ## stop the project's PostgreSQL (its data stays in .cluster/pg)
	bash cluster/postgres.sh down

discover: $(VENV)/.installed ## write conf/partition stubs from this cluster's sinfo/scontrol
	$(QUALIFY) discover --args-from-env SQ_ARGS

sync: $(VENV)/.installed ## replay ledgers kept while MLflow was down, each to the URI it recorded (SWEEP=<id>; ARGS='--tracking-uri URI')
	$(QUALIFY) sync $(if $(value SWEEP),--sweep "$$SQ_SWEEP") --args-from-env SQ_ARGS

test: $(VENV)/.installed ## all tests this machine can run (starts the local Slurm when it is installed)
	@bash scripts/test.sh $(PYTEST_ARGS)

test-fast: $(VENV)/.installed ## unit tests only (--suite unit: tests/unit/, no multi-process, Slurm, GPU or browser test), in two workers (worksteal)
	$(PY) -m pytest -q -n 2 --dist worksteal --suite unit $(PYTEST_ARGS)

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
	@for b in benchmarks/bench_*.py; do b=$${b##*/}; echo "== python -m benchmarks.$${b%.py}"; $(PY) -m "benchmarks.$${b%.py}" || exit 1; done

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
