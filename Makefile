# The README's two commands: `make demo` and `make test`. Both create .venv and install what they need.
SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
CLUSTER := $(PY) -m slurm_elastic.testing.devcluster
PYTEST_ARGS ?=

.PHONY: venv demo test lint typecheck unit cluster-up cluster-down cluster-status cluster-env clean

venv: $(STAMP)

# The venv sees system packages so that a site's own (GPU) torch is kept; torch 2.13.0 (a CPU build on
# this kind of machine) is installed only where no torch imports at all.
$(STAMP): pyproject.toml setup.cfg
	test -x $(PY) || $(PYTHON) -m venv --system-site-packages $(VENV)
	$(PY) -c 'import torch' 2>/dev/null || $(PY) -m pip install -q 'torch==2.13.0'
	$(PY) -m pip install -q -e '.[dev]'
	touch $(STAMP)

demo: $(STAMP)
	$(VENV)/bin/slurm-elastic demo

lint: $(STAMP)
	$(VENV)/bin/ruff check slurm_elastic tests examples
	$(VENV)/bin/ruff format --check slurm_elastic tests examples

typecheck: $(STAMP)
	$(VENV)/bin/mypy

# Everything: static checks, then the whole suite with the local Slurm cluster up (brought down even when
# a test fails). The Slurm tests fail rather than skip when the cluster is required but unreachable.
test: lint typecheck
	$(CLUSTER) up
	set -o pipefail; rc=0; \
	  SLURM_ELASTIC_REQUIRE_SLURM=1 $(PY) -m pytest -q -p no:cacheprovider $(PYTEST_ARGS) || rc=$$?; \
	  $(CLUSTER) down || true; exit $$rc

unit: $(STAMP)
	$(PY) -m pytest -q -m 'not slurm' $(PYTEST_ARGS)

cluster-up: $(STAMP)
	$(CLUSTER) up

cluster-down: $(STAMP)
	$(CLUSTER) down

cluster-status: $(STAMP)
	$(CLUSTER) status

cluster-env: $(STAMP)
	@$(CLUSTER) env

clean:
	rm -rf $(VENV) .cluster build *.egg-info .pytest_cache .mypy_cache .ruff_cache
