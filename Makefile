# The two commands in the README: `make run` and `make test`.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
WORKDIR ?= workdir/digits
CONFIG ?= configs/digits.py
ARGS ?=

.PHONY: run test lint format bench clean

$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[test]'
	touch $@

venv: $(VENV)/.installed

run: $(VENV)/.installed
	$(PY) experiments/compare.py --config=$(CONFIG) --workdir=$(WORKDIR) $(ARGS)

test: $(VENV)/.installed
	$(PY) -m pytest -n auto -q $(ARGS)

lint: $(VENV)/.installed
	$(VENV)/bin/ruff check . && $(VENV)/bin/ruff format --check .

format: $(VENV)/.installed
	$(VENV)/bin/ruff format . && $(VENV)/bin/ruff check --fix .

bench: $(VENV)/.installed
	$(PY) experiments/bench_step.py

clean:
	rm -rf $(VENV) workdir
