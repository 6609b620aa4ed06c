# The two commands of the README: `make demo` (install + default study) and `make test`;
# `make cpu-full` runs the extended CPU study (workflow/studies/cpu-full.yaml) on top of the demo.
VENV   ?= .venv
PYTHON ?= python3
# torch==2.13.0 is the CPU wheel on the CPU machines this project is developed on; on a GPU
# cluster install the CUDA build you want into the venv first (README, "GPU clusters").
TORCH  ?= torch==2.13.0
CORES  ?= all
TARGETS ?=
BIN     = $(VENV)/bin

.PHONY: install demo cpu-full test lint

install: $(VENV)/.installed

$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q "$(TORCH)"
	$(BIN)/python -m pip install -q -e ".[dev]"
	touch $@

demo: install
	$(BIN)/snakemake --cores $(CORES)

# Targets go before --configfile, which takes every word after it as a config file.
cpu-full: install
	$(BIN)/snakemake $(TARGETS) --cores $(CORES) --configfile config.yaml workflow/studies/cpu-full.yaml

test: install
	$(BIN)/python -m pytest

lint: install
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/snakefmt --check Snakefile workflow/rules
	$(BIN)/snakemake --lint
