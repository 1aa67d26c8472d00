# ESP retrieval — the README's commands. Everything runs inside .venv, created on first use.
PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed-stamp

.PHONY: setup test lint demo bench clean

# Re-installs only when requirements.txt or pyproject.toml changed since the last install.
$(STAMP): requirements.txt pyproject.toml
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q -r requirements.txt
	$(PY) -m pip install -q --no-deps --no-build-isolation -e .
	@touch $(STAMP)

setup: $(STAMP)

# pytest exits 5 when it collected no test; make treats any non-zero exit as failure.
test: setup
	$(PY) -m pytest

lint: setup
	$(PY) -m ruff check .
	$(PY) -m mypy

demo: setup
	@echo "make demo: the service that serves the trained bundle is not wired up yet." >&2
	@echo "           Still missing: training (esp train) and the service (esp serve)." >&2
	@exit 1

bench: setup
	$(PY) bench/knn.py --quick

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache
