# scorelib: `make test` installs everything from nothing and runs the whole suite.
PY      ?= python3
VENV    ?= .venv
BIN     := $(VENV)/bin
STAMP   := $(VENV)/.installed

.PHONY: install test test-fast demo bench lint clean

$(BIN)/python:
	$(PY) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip

$(STAMP): $(BIN)/python pyproject.toml constraints.txt
	$(BIN)/python -m pip install -q -c constraints.txt -e '.[test]'
	touch $(STAMP)

install: $(STAMP)

test: $(STAMP)
	$(BIN)/python -m pytest -q --durations=15 tests

test-fast: $(STAMP)
	$(BIN)/python -m pytest -q -m "not slow" tests

# The main job: EDM on the real 8x8 digits (train, sample with Heun-18), then the tables of
# FD, two-sample test, precision/recall, bits/dim and memorisation, each beside its floor and
# a Gaussian baseline. Rerunning resumes (or reuses) outputs/digits_edm.
demo: $(STAMP)
	$(BIN)/python -m experiments.train experiment=digits_edm
	$(BIN)/python -m experiments.evaluate run_dir=outputs/digits_edm

bench: $(STAMP)
	$(BIN)/python benchmarks/samplers.py

lint: $(STAMP)
	$(BIN)/ruff check .

clean:
	rm -rf $(VENV) .pytest_cache
