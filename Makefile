# The two commands of the README: `make demo` (install + default study) and `make test`.
VENV   ?= .venv
PYTHON ?= python3
# torch==2.13.0 is the CPU wheel on the CPU machines this project is developed on; on a GPU
# cluster install the CUDA build you want into the venv first (README, "GPU clusters").
TORCH  ?= torch==2.13.0
CORES  ?= all
BIN     = $(VENV)/bin

.PHONY: install demo test lint figures clean-results

install: $(VENV)/.installed

$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q "$(TORCH)"
	$(BIN)/python -m pip install -q -e ".[dev]"
	touch $@

demo: install
	$(BIN)/snakemake --cores $(CORES)

test: install
	$(BIN)/python -m pytest

lint: install
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/snakefmt --check Snakefile workflow/rules
	$(BIN)/snakemake --lint
