# The two commands of the README: `make demo` and `make test`. Both create .venv and install first.
PYTHON ?= python3
# torch is installed first and pinned, so pip never resolves another (CUDA) build; override on your machine.
TORCH ?= torch==2.13.0
VENV := .venv
BIN := $(VENV)/bin

$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --disable-pip-version-check "$(TORCH)"
	$(BIN)/pip install --quiet --disable-pip-version-check -e ".[dev]"
	touch $@

.PHONY: install demo test
install: $(VENV)/.installed

demo: $(VENV)/.installed
	$(BIN)/fastdecode demo

test: $(VENV)/.installed
	$(BIN)/python -m pytest
