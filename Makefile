# Every target builds its own virtual environment; nothing is installed by hand.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed-dev
BENCH_STAMP := $(VENV)/.installed-bench

.PHONY: demo test bench lint faults docs clean

$(STAMP): pyproject.toml
	@$(PYTHON) -c 'import sys; assert sys.version_info >= (3, 11), "tether needs Python 3.11+"'
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[dev,docs]'
	@touch $@

$(BENCH_STAMP): $(STAMP)
	$(PY) -m pip install --quiet -e '.[dev,bench]'
	@touch $@

demo: $(STAMP)
	$(VENV)/bin/tether demo

test: $(STAMP)
	$(PY) -m ruff check src tests bench
	$(PY) -m mypy
	# The documentation site, strictly: a broken link or reference fails the run.
	$(MAKE) --no-print-directory docs
	# Everything, including the fault-injection suite's short profile (tests/faults).
	$(PY) -m pytest -q

# The documentation site (MkDocs) into site/; the CLI reference runs the `typer` command.
docs: $(STAMP)
	PATH="$(abspath $(VENV))/bin:$$PATH" NO_MKDOCS_2_WARNING=1 $(PY) -m mkdocs build --strict --quiet

bench: $(BENCH_STAMP)
	$(PY) bench/run.py --sweep

# The fault-injection suite. TETHER_FAULTS=full uses the issue's counts and writes
# tests/faults/REPORT.md; the default is the short profile. PostgreSQL restarts act on
# a private throwaway cluster, never on the shared server.
faults: $(STAMP)
	$(PY) -m pytest tests/faults -q

lint: $(STAMP)
	$(PY) -m ruff check src tests bench
	$(PY) -m ruff format --check src tests bench
	$(PY) -m mypy

clean:
	rm -rf $(VENV) site .pytest_cache .mypy_cache .ruff_cache *.db *.db-wal *.db-shm .tether
