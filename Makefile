# Two commands on a fresh machine: `make demo` and `make test`.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed

.PHONY: demo test bench install clean

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --upgrade pip
	# the CPU wheel first: anything that depends on torch must find it installed
	$(BIN)/python -m pip install torch==2.13.0
	$(BIN)/python -m pip install -e ".[dev]"
	touch $(STAMP)

install: $(STAMP)

demo: $(STAMP)
	$(BIN)/weightplan demo

test: $(STAMP)
	$(BIN)/ruff check weightplan tests benchmarks scripts
	$(BIN)/mypy
	$(BIN)/python -m pytest

bench: $(STAMP)
	$(BIN)/python benchmarks/load.py

clean:
	rm -rf $(VENV) build *.egg-info .pytest_cache .hypothesis
