# The README's two commands: `make demo` and `make test`. Both create .venv and install what they need.
SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
CLUSTER := $(PY) -m slurm_elastic.testing.devcluster
PYTEST_ARGS ?=

.PHONY: venv demo test bench lint typecheck unit cluster-up cluster-down cluster-status cluster-env clean

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

# Everything: the whole suite with the local Slurm cluster up (brought down even when a test fails), and
# the static checks. The Slurm tests fail rather than skip when the cluster is required but unreachable.
# They mostly wait (on Slurm, on paced jobs), so they start first and run beside the static checks and the
# rest, each half in a directory of its own; the Slurm half's output follows the other's, and the suite
# fails if either half does (a failed static check stops the Slurm half at once).
SUITE := SLURM_ELASTIC_REQUIRE_SLURM=1 $(PY) -m pytest -q -p no:cacheprovider $(PYTEST_ARGS)
test: $(STAMP)
	$(CLUSTER) up
	rc=0; base=$$(mktemp -d /tmp/slurm-elastic-test.XXXXXX); \
	  $(SUITE) --basetemp="$$base/slurm" tests/slurm > "$$base/slurm.log" 2>&1 & slurm=$$!; \
	  if $(MAKE) --no-print-directory lint typecheck; then \
	    $(SUITE) --basetemp="$$base/rest" --ignore=tests/slurm || rc=$$?; \
	  else rc=2; kill $$slurm; fi; \
	  wait $$slurm || rc=$$((rc ? rc : $$?)); \
	  echo "--- the Slurm tests:"; cat "$$base/slurm.log"; \
	  $(CLUSTER) down || true; [ $$rc -ne 0 ] || rm -rf "$$base"; exit $$rc

# Every benchmark, one after another on this machine (about an hour on 2 cores), each writing its JSON into
# docs/bench/ (a file is replaced only by a run that succeeded), then docs/benchmarks.md and its plots.
SE := $(VENV)/bin/slurm-elastic
BENCH := docs/bench
define bench_json
	$(1) > $(BENCH)/$(2).part && mv $(BENCH)/$(2).part $(BENCH)/$(2)
endef

bench: $(STAMP)
	$(call bench_json,$(SE) bench mttr --json,mttr.json)
	$(call bench_json,$(SE) chaos --json --losses,chaos.json)
	$(call bench_json,$(SE) bench overhead --json,overhead.json)
	for n in 256 1024 2048 4096; do \
	  $(SE) bench coordinator --agents $$n --json > $(BENCH)/coordinator-$$n.json.part && \
	  mv $(BENCH)/coordinator-$$n.json.part $(BENCH)/coordinator-$$n.json || exit 1; done
	$(call bench_json,$(SE) bench coordinator --agents 4096 --workers 8 --json,coordinator-4096x8.json)
	$(call bench_json,$(SE) bench rendezvous --json,rendezvous.json)
	$(CLUSTER) up
	set -o pipefail; rc=0; \
	  { $(SE) bench mttr --slurm --kills 3 --json > $(BENCH)/mttr-slurm.json.part && \
	    mv $(BENCH)/mttr-slurm.json.part $(BENCH)/mttr-slurm.json && \
	    $(SE) bench notify --json > $(BENCH)/notify.json.part && \
	    mv $(BENCH)/notify.json.part $(BENCH)/notify.json; } || rc=$$?; \
	  $(CLUSTER) down || true; exit $$rc
	$(call bench_json,$(SE) simulate --gpus 16384 --json --plot $(BENCH)/goodput.png,simulate.json)
	$(SE) bench report

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
	rm -rf $(VENV) .cluster build *.egg-info .pytest_cache .mypy_cache .ruff_cache $(BENCH)/*.part
