PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: install test demo lint bench clean

# Idempotent: rebuilt only when pyproject.toml changes.
$(STAMP): pyproject.toml setup.py tessera/ptx/_fastscan.c
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/pip install -q --disable-pip-version-check -e '.[dev]'
	touch $(STAMP)

install: $(STAMP)

test: $(STAMP)
	$(BIN)/ruff check tessera tests bench
	OMP_NUM_THREADS=1 $(BIN)/python -m pytest

demo: $(STAMP)
	$(BIN)/python -m tessera.demo

bench: $(STAMP)
	for f in bench/bench_*.py; do OMP_NUM_THREADS=1 $(BIN)/python $$f || exit 1; done

clean:
	rm -rf $(VENV) out .pytest_cache .ruff_cache
