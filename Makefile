# ESP retrieval — the README's commands. Everything runs inside .venv, created on first use.
PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed-stamp

.PHONY: setup test test-fast lint demo bench clean

# Re-installs only when requirements.txt or pyproject.toml changed since the last install.
$(STAMP): requirements.txt pyproject.toml
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	@# --no-compile: no .pyc up front (80 s instead of 164 s here); the first start compiles what it imports
	$(PY) -m pip install -q --no-compile -r requirements.txt
	$(PY) -m pip install -q --no-deps --no-build-isolation -e .
	@touch $(STAMP)

setup: $(STAMP)

# pytest exits 5 when it collected no test; make treats any non-zero exit as failure.
# `make test` runs every test; `make test-fast` only the unit tier: no test marked live (a real
# server or process on loopback), browser (headless chromium), slow (training, big fixtures) or gpu.
FAST := not live and not browser and not slow and not gpu
# The suite starts dozens of Python processes (servers, scripts, ranks) that import torch,
# transformers and fastapi. Where PYTHONDONTWRITEBYTECODE is set (many container images set it)
# each would compile them again, ~10 s of CPU per start: the tests keep their byte code in the
# venv instead (outside the source tree; `make clean` removes it).
PYCACHE := env -u PYTHONDONTWRITEBYTECODE PYTHONPYCACHEPREFIX=$(abspath $(VENV))/pycache

# `make test` and `make test-fast` spread the test files over one pytest-xdist worker per core
# (JOBS=0: no worker, one process);
# the files holding slow tests go out first (tests/conftest.py).
JOBS ?= auto
test: setup
	$(PYCACHE) $(PY) -m pytest -n $(JOBS) --dist loadscope --no-loadscope-reorder

test-fast: setup
	$(PYCACHE) $(PY) -m pytest -m "$(FAST)" -n $(JOBS) --dist loadscope --no-loadscope-reorder

lint: setup
	$(PY) -m ruff check .
	$(PY) -m mypy

# Trains once (no bundle under artifacts/demo yet), then serves on 127.0.0.1:8000 in the foreground and prints
# two example requests (semantic-heavy vs entity-heavy weights) once /readyz is 200. Ctrl-C stops it.
DEMO_DIR ?= artifacts/demo
demo: setup
	@test -n "$$(find $(DEMO_DIR) -name manifest.json 2>/dev/null | head -n 1)" \
		|| $(PY) -m esp_retrieval.cli train --config configs/demo.yaml --out $(DEMO_DIR)
	$(PY) -m esp_retrieval.cli.demo --artifacts $(DEMO_DIR) --host 127.0.0.1 --port 8000

bench: setup
	$(PY) bench/knn.py --quick

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache

# --- Deployment: docker/, helm/esp-retrieval/, k8s-manifests/, deploy/ (all checks run offline) ---
.PHONY: dashboards manifests settings-doc deploy-check monitor-check

# Regenerate the Grafana dashboards (deploy/dashboards.py) into helm/esp-retrieval/dashboards/.
dashboards: setup
	$(PY) -m deploy.dashboards

# Re-render k8s-manifests/ (kustomize base + overlays cpu, gpu) from the chart.
manifests: setup
	$(PY) -m deploy.manifests

# Regenerate docs/settings.md (every ESP_* setting, where the chart sets it) from esp_retrieval/service/config.py.
settings-doc: setup
	$(PY) -m deploy.settings_doc

# Every deployment check: chart render + strict schema validation, manifests drift, hadolint,
# promtool on alerts and dashboard queries, metrics exported by a live service, Prometheus.
deploy-check: setup
	$(PY) -m pytest tests/deploy -q

# Debian's Prometheus on loopback scrapes a running `esp serve` and answers dashboard queries.
monitor-check: setup
	@command -v prometheus >/dev/null || { echo "monitor-check needs prometheus: apt-get install prometheus" >&2; exit 1; }
	$(PY) -m pytest tests/deploy/test_live_monitoring.py -q -rs
