PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: install test demo lint bench clean

# Idempotent: rebuilt only when pyproject.toml, setup.py or the C module (tessera/ptx/_fastscan.c) change.
$(STAMP): pyproject.toml setup.py tessera/ptx/_fastscan.c
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/pip install -q --disable-pip-version-check -e '.[dev]'
	touch $(STAMP)

install: $(STAMP)

# Two test processes (the suite is mostly single-threaded work); whole files per process, so a module's
# fixtures (captures, clusters) are built once.
test: $(STAMP)
	$(BIN)/ruff check tessera tests bench
	OMP_NUM_THREADS=1 $(BIN)/python -m pytest -n 2 --dist loadfile
	TESSERA_PTX_NATIVE=0 $(BIN)/python -m pytest -q tests/ptx  # the pure-Python path the C module replaces

demo: $(STAMP)
	$(BIN)/python -m tessera.study.demo --results bench/results

bench: $(STAMP)
	for f in bench/bench_*.py; do OMP_NUM_THREADS=1 $(BIN)/python $$f || exit 1; done

clean:
	rm -rf $(VENV) out .pytest_cache .ruff_cache build tessera/ptx/*.so
