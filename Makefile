# `make demo` and `make test` create the virtual environment when it is missing.
PYTHON ?= $(shell command -v python3.11 || command -v python3)
VENV ?= .venv
BIN = $(VENV)/bin

.PHONY: demo test bench lint clean

$(BIN)/.installed: pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[test]'
	touch $@

demo: $(BIN)/.installed
	$(BIN)/fleetctl demo

test: $(BIN)/.installed
	$(BIN)/python -m pytest -q -p no:cacheprovider

bench: $(BIN)/.installed
	$(BIN)/python bench/run_all.py

lint: $(BIN)/.installed
	$(BIN)/python -m pip install --quiet -e '.[dev]'
	$(BIN)/ruff check .
	$(BIN)/mypy

clean:
	rm -rf $(VENV) *.egg-info fleet.db fleet.db-* .pytest_cache
