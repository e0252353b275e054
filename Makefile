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

.PHONY: setup test test-fast coverage mutate mutate-stop reproduce demo demo-search smoke bench-data lint lock clean gpu-bundle

setup: $(VENV)/.installed  ## create .venv with the pinned dependencies (torch==2.13.0 included)

# pip itself first, pinned: a venv's bundled pip (23.2 with Python 3.11) took 118-124 s here
# for the install below, most of it finding the pinned versions in the index; 26.3, 87-92 s.
PIP_VERSION ?= 26.3

$(VENV)/.installed: requirements.txt constraints.txt pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --disable-pip-version-check pip==$(PIP_VERSION)
	$(BIN)/python -m pip install -q --disable-pip-version-check -r requirements.txt -c constraints.txt
	$(BIN)/python -m pip install -q --disable-pip-version-check --no-deps --no-build-isolation -e .
	touch $@

# pytest-xdist runs the tests in TEST_WORKERS processes, a module each at a time (the modules
# of the shared tiny pipelines together; tests/conftest.py); TEST_WORKERS=0: one process.
# Three on two cores: many tests wait on the processes they start (orchestrators, trainings),
# and a third worker fills those waits (docs/testing.md: the CPU busy 194 % of the run, and
# 976 s of pytest where two workers took 1,058 s, on one 2-core Intel Xeon).
TEST_WORKERS ?= 3
# Through tools/cpu_seconds.py: pytest, then the CPU-seconds of each module and of the
# heaviest tests (their child processes included), the Python processes the run started and
# their imports of torch, and this host's speed during and after the run: on 2 cores the suite
# is bound by CPU, and the same tests took twice the CPU-seconds on one host hours apart.
PYTEST := $(BIN)/python tools/cpu_seconds.py -n $(TEST_WORKERS)

test: setup  ## the whole test suite, the smoke runs of both orchestrators included
	$(PYTEST)

test-fast: setup  ## every test but the end-to-end runs of the orchestrators: the edit-test loop
	$(PYTEST) -m "not slow"

# Line coverage of src/nmt, the `nmt` commands that DVC and Snakemake run in the tests' copies
# of the repository included (coverage's subprocess patch; pyproject.toml [tool.coverage]).
coverage: setup  ## the whole test suite, with the line coverage of each module of src/nmt
	$(BIN)/python -m pytest -n $(TEST_WORKERS) --cov --cov-report=term

# Mutation testing (tools/mutate.py; mutmut, configured in pyproject.toml): mutants of the
# models, the numeric core, the stage code behind the report and the training loop (two
# profiles), each run against the tests that call its function; writes docs/mutation.md.
# Long (docs/testing.md gives the minutes), so not part of make test or CI.
# MODULE=src/nmt/core/stats.py: that module's mutants not killed yet (a stopped run goes on).
# PROFILE=training (or core): that profile's whole run, from the record where it is of this tree.
MODULE ?=
PROFILE ?=
mutate: setup  ## mutation testing (two profiles): docs/mutation.md (MODULE=path: one module; PROFILE=core or training: one profile)
	$(BIN)/python tools/mutate.py $(if $(MODULE),--module $(MODULE)) $(if $(PROFILE),--profile $(PROFILE))

# A whole run outlasts a session: stop it with this (from another shell in the same checkout),
# not Ctrl-C, whose SIGINT reaches the tests and can decide the verdicts of the mutants running;
# it leaves no process behind and the record (docs/mutation-record.json) with only the tests'
# verdicts, to commit and go on from in a new clone (tools/mutate_stop.py).
mutate-stop:  ## stop a running make mutate: its record keeps only the verdicts the tests gave
	$(BIN)/python tools/mutate_stop.py

check-data: setup  ## every SHA256SUMS and DVC cache object against the bytes: one line a damaged file (`nmt check`)
	$(BIN)/nmt check

reproduce: setup  ## the whole comparison: download ... report (`dvc repro`)
	$(BIN)/dvc repro

# The whole comparison at a CPU-friendly size (recipe `demo`: every model about 10 minutes of
# training on 2 cores) as a DVC experiment: params.yaml in the workspace then holds these
# settings and reports/ the result; `dvc exp show` lists it, `git checkout params.yaml
# dvc.lock` goes back. DEMO_SEEDS='[0,1,2]' gives reports/demo/ (three seeds a model: the verdict).
# One seed (the default) is a first look: its report says the verdict is not measured.
DEMO_SEEDS ?= [0]
demo: setup  ## the comparison on a laptop: recipe demo, 3 models, 4-12 min of training each (nmt estimate says)
	$(BIN)/nmt estimate --recipe demo
	$(BIN)/dvc exp run -S 'pipeline.recipes=[demo]' \
		-S 'pipeline.models=[baseline,scratch,decoder_only]' -S 'pipeline.seeds=$(DEMO_SEEDS)' \
		-S 'bench.recipe=demo'

# The search that chose the demo recipe: its steps (recipes demo_s0 ... with step_of/adds)
# trained with the scratch model, seed 0, judged on the validation set only; no test set is
# decoded. A later `make demo` report lists them (section "Recipe search"). The decoder-only
# model's own steps: make demo-search DEMO_STEPS='[demo_d1,demo_d2,demo_d3,demo_d4]' SEARCH_MODELS='[decoder_only]'
DEMO_STEPS ?= [demo_s0,demo_s1,demo_s2,demo_s3,demo_s4,demo_s5,demo_s6,demo_s7,demo_s8,demo_s9,demo_s10,demo_s11]
SEARCH_MODELS ?= [scratch]
comma := ,
first_step = $(firstword $(subst $(comma), ,$(subst [,,$(subst ],,$(DEMO_STEPS)))))
demo-search: setup  ## train the demo recipe's search steps (~10 min each), validation only
	$(BIN)/dvc exp run -S 'pipeline.recipes=$(DEMO_STEPS)' -S 'pipeline.models=$(SEARCH_MODELS)' \
		-S 'pipeline.seeds=[0]' -S 'bench.recipe=$(first_step)' train

smoke: setup  ## the whole pipeline on tiny settings in a scratch copy, with DVC and Snakemake
	$(BIN)/python -m pytest -m slow tests/test_pipeline.py

# The data stages at scale: download, tokenize, vocab and an epoch of batches on a synthetic
# corpus of PAIRS pairs built from the Multi30k files (data/raw; `nmt download` fetches them),
# each step's seconds, pairs/s and peak memory; the report shows results/data_bench.json.
PAIRS ?= 1000000
bench-data: setup  ## time the data stages and their peak memory on 1 M pairs (~10 min on 2 cores)
	test -f data/raw/train.de.gz || $(BIN)/nmt download --out data/raw
	$(BIN)/nmt bench --data --pairs $(PAIRS) --raw data/raw --json results/data_bench.json

lint: setup  ## ruff and snakemake --lint
	$(BIN)/ruff check src tests tools
	$(BIN)/snakemake --lint

lock: setup  ## rewrite constraints.txt from the installed environment
	{ head -2 constraints.txt; $(BIN)/python -m pip freeze --exclude-editable | grep -v -iE '^(torch|nmt)=='; } > constraints.tmp && mv constraints.tmp constraints.txt

# A GPU machine without network or the tools (PyTorch only): build the data here and fetch
# the wheels it lacks, then carry data/, params/ and .whl/ there and run tools/gpu/run.sh.
gpu-bundle: setup  ## data stages + wheels for a GPU machine that has PyTorch but no network
	bash tools/gpu/bundle.sh

clean:  ## remove the environment and local caches (not data/ or results/)
	rm -rf $(VENV) .pytest_cache .ruff_cache .snakemake logs .coverage .coverage.*
