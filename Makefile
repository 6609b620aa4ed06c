# The two commands of the README: `make demo` (install + default study) and `make test`
# (`make check`, its fast tier, before each commit);
# `make cpu-full` runs the extended CPU study (workflow/studies/cpu-full.yaml) on top of the demo;
# `make cost` prints what a study will cost before it runs.
VENV   ?= .venv
PYTHON ?= python3
# torch comes from where pip finds it: a wheel folder pip is set up with (the CPU wheel on this
# project's machines), else PyPI (on Linux its CUDA build, which brings the CUDA libraries), or
# the index TORCH_INDEX names: make install TORCH_INDEX=https://download.pytorch.org/whl/cpu
# (the CPU build) or .../whl/cu128 (docs/clusters.md, "Installing for a GPU").
TORCH  ?= torch==2.13.0
TORCH_INDEX ?=
CORES  ?= all
TARGETS ?=
BIN     = $(VENV)/bin

.PHONY: install check-install demo cpu-full cost check test lint lock

# Every package but torch comes from the lock, at its version and checked against its hashes,
# torch's own dependencies among them; torch comes next, and only what the lock lacks comes
# with it (a CUDA build's libraries): its CPU and CUDA builds are different files, so the lock
# cannot name one hash (docs/development.md, "The lock").
LOCK = requirements/cpu.lock.txt
install: $(VENV)/.installed

$(VENV)/.installed: pyproject.toml $(LOCK)
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q --no-deps --require-hashes -r $(LOCK)
	$(BIN)/python -m pip install -q "$(TORCH)" $(if $(TORCH_INDEX),--index-url $(TORCH_INDEX))
	$(BIN)/python -m pip install -q --no-deps -e .
	$(BIN)/python -m pip check
	touch $@

# The install as plain PyPI resolves it (no wheel folder, torch's CUDA build), from metadata
# alone, checked against the lock; one line and success when PyPI is out of reach (CI runs it).
check-install: install
	$(BIN)/python requirements/check_install.py --torch "$(TORCH)"

# Rewrite the lock after a change of pyproject.toml's dependencies, keeping the versions it holds
# where they still fit; `make lock UPGRADE=--upgrade` moves every package to its newest fitting
# release. torch's dependencies are those of the CPU wheel, found in TORCH_WHEELS (a folder or
# a page of links); torch itself is left out of the file.
TORCH_WHEELS ?= $(if $(wildcard /opt/wheels/torch-*),/opt/wheels,https://download.pytorch.org/whl/cpu/torch/)
UPGRADE ?=
UV ?= $(if $(wildcard $(BIN)/uv),$(BIN)/uv,uv)
LOCK_HEADER = "\# The locked CPU install of ihsweep and its dev extra: Python 3.11, Linux x86_64," \
	"\# every package with its hashes but torch, which the Makefile installs first." \
	"\# Regenerate: make lock (make lock UPGRADE=--upgrade: newest fitting releases)."
lock:
	echo "$(TORCH)" | $(UV) pip compile pyproject.toml - --extra dev --generate-hashes \
		--python-version 3.11 --python-platform x86_64-manylinux_2_28 \
		--find-links $(TORCH_WHEELS) --no-emit-package torch $(UPGRADE) \
		--no-header --quiet --output-file $(LOCK)
	{ printf '%s\n' $(LOCK_HEADER); cat $(LOCK); } > $(LOCK).tmp
	mv $(LOCK).tmp $(LOCK)

# Each ends with the study's report (a few seconds, rebuilt every time from the cached results;
# not after TARGETS, a part of the study): its front page gives the findings beside the paper's.
demo: install
	$(BIN)/snakemake --cores $(CORES)
	$(BIN)/snakemake --report results/studies/default/report.html
	@echo "The default study's findings, beside the paper's: results/studies/default/report.html"
	@echo "Predict when IHs emerge for a new B and C (docs/predict.md):"
	@echo "  $(BIN)/python -m ihsweep.predict -B 1024 -C 2048 --law study:default"

# Targets go before --configfile, which takes every word after it as a config file.
CPU_FULL = --configfile config.yaml workflow/studies/cpu-full.yaml
cpu-full: install
	$(BIN)/snakemake $(TARGETS) --cores $(CORES) $(CPU_FULL)
	$(if $(TARGETS),,$(BIN)/snakemake --report results/studies/cpu-full/report.html $(CPU_FULL))
	$(if $(TARGETS),,@echo "cpu-full's findings, beside the paper's: results/studies/cpu-full/report.html")

# What a study costs (python -m ihsweep.cost: per run its tokens, memory, device-hours and
# walltime, then the totals): the study in config.yaml, or the config files of CONFIGFILES, as
# Snakemake merges them: make cost CONFIGFILES="config.yaml workflow/studies/cpu-full.yaml".
CONFIGFILES ?=
cost: install
	$(BIN)/python -m ihsweep.cost $(if $(CONFIGFILES),--configfile $(CONFIGFILES))

# The two tiers of tests (docs/development.md, "Tests"): `make check`, the tests not marked slow,
# before each commit; `make test`, every test, what CI runs. Both spread whole test modules over
# a pytest-xdist worker per logical CPU (-n auto counts physical cores: a VM's two hyperthreads
# may count as one), so that a module's shared fixture (a study, the SLURM cluster) is built once;
# tests/conftest.py orders the modules with the most slow tests first.
XDIST = -n logical --dist loadscope --no-loadscope-reorder
DURATIONS = --durations=20  # the slowest tests, printed at the end of every run
check: install
	$(BIN)/python -m pytest -m "not slow" $(XDIST) $(DURATIONS)

test: install
	$(BIN)/python -m pytest $(XDIST) $(DURATIONS)

lint: install
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/snakefmt --check Snakefile workflow/rules
	$(BIN)/snakemake --lint
	$(BIN)/lint-imports
