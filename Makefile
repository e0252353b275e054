# The targets a newcomer needs. `make reproduce` runs the comparison, `make test` the tests.
VENV   ?= .venv
PYTHON ?= python3
BIN    := $(abspath $(VENV))/bin
# Stage commands (`nmt ...`, `dvc`, `snakemake`) come from the project's virtual environment.
export PATH := $(BIN):$(PATH)
# The Multi30k mirror beside this checkout (CI and offline machines); unset = public repo.
MIRROR := $(abspath ../shared/multi30k)
ifneq ($(wildcard $(MIRROR)/SHA256SUMS),)
export MULTI30K_MIRROR ?= $(MIRROR)
endif

.PHONY: setup test reproduce smoke lint lock clean

setup: $(VENV)/.installed  ## create .venv with the pinned dependencies (torch==2.13.0 included)

$(VENV)/.installed: requirements.txt constraints.txt pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --disable-pip-version-check -r requirements.txt -c constraints.txt
	$(BIN)/python -m pip install -q --disable-pip-version-check --no-deps --no-build-isolation -e .
	touch $@

test: setup  ## the whole test suite, the smoke runs of both orchestrators included
	$(BIN)/python -m pytest

reproduce: setup  ## the whole comparison: download ... report (`dvc repro`)
	$(BIN)/dvc repro

smoke: setup  ## the whole pipeline on tiny settings in a scratch copy, with DVC and Snakemake
	$(BIN)/python -m pytest -m slow tests/test_pipeline.py

lint: setup  ## ruff and snakemake --lint
	$(BIN)/ruff check src tests
	$(BIN)/snakemake --lint

lock: setup  ## rewrite constraints.txt from the installed environment
	{ head -2 constraints.txt; $(BIN)/python -m pip freeze --exclude-editable | grep -v -iE '^(torch|nmt)=='; } > constraints.tmp && mv constraints.tmp constraints.txt

clean:  ## remove the environment and local caches (not data/ or results/)
	rm -rf $(VENV) .pytest_cache .ruff_cache .snakemake logs
