# syntax=docker/dockerfile:1
# ESP retrieval service, CPU. Build from the repository root:
#   docker build -f docker/service.Dockerfile -t esp-retrieval:0.1.0 .
#   docker build -f docker/service.Dockerfile --build-arg BUNDLE=artifacts/demo/bundle -t esp-retrieval:0.1.0-demo .
# Without BUNDLE the image holds no bundle: mount one at /models/bundle (Helm: bundle.source=pvc).

ARG PYTHON_IMAGE=python:3.11.11-slim-bookworm

FROM ${PYTHON_IMAGE} AS deps
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1 PYTHONDONTWRITEBYTECODE=1
RUN python -m venv /opt/venv
ENV PATH=/opt/venv/bin:$PATH
WORKDIR /src
# Dependency layer: changes only when the pins change, not with every code edit.
COPY requirements.txt pyproject.toml ./
COPY deploy/pins.py deploy/pins.py
# torch from the CPU wheel index first (the PyPI Linux wheel pulls ~3 GB of CUDA libraries);
# the rest at the exact pins of requirements.txt: the serve extra and the Milvus client (an
# external Milvus by URI: ESP_BACKEND=milvus); not Milvus Lite.
ARG TORCH_INDEX=https://download.pytorch.org/whl/cpu
RUN python deploy/pins.py serve milvus --exclude torch > /tmp/serve.txt \
    && pip install --index-url "${TORCH_INDEX}" "$(grep -E '^torch==' requirements.txt)" \
    && pip install -r /tmp/serve.txt
# Code layer.
COPY esp_retrieval/__init__.py esp_retrieval/__init__.py
COPY esp_retrieval/subspace esp_retrieval/subspace
COPY esp_retrieval/encoder esp_retrieval/encoder
COPY esp_retrieval/service esp_retrieval/service
COPY esp_retrieval/cli esp_retrieval/cli
RUN pip install --no-deps .

# The bundle with modes any uid can read and only root can change, whatever uid wrote it
# (safetensors writes 0600, and COPY keeps a file's mode); fixed in its own stage so the final
# image holds one copy of it.
FROM ${PYTHON_IMAGE} AS bundle
ARG BUNDLE=docker/empty-bundle
COPY ${BUNDLE} /models/bundle
RUN chmod -R a+rX,go-w /models/bundle

FROM ${PYTHON_IMAGE}
ENV PATH=/opt/venv/bin:$PATH \
    PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1 \
    HF_HUB_OFFLINE=1 \
    TRANSFORMERS_OFFLINE=1 \
    HOME=/tmp \
    ESP_HOST=0.0.0.0 \
    ESP_PORT=8000 \
    ESP_BUNDLE=/models/bundle
RUN groupadd --system --gid 10001 esp \
    && useradd --system --uid 10001 --gid esp --no-create-home --home-dir /nonexistent --shell /usr/sbin/nologin esp
COPY --from=deps /opt/venv /opt/venv
COPY --from=bundle --chown=root:root /models/bundle /models/bundle
USER 10001:10001
EXPOSE 8000
# /healthz: the process answers (readiness, /readyz, is Kubernetes' business).
HEALTHCHECK --interval=30s --timeout=3s --start-period=20s --retries=3 \
    CMD ["python", "-c", "import os, urllib.request; urllib.request.urlopen('http://127.0.0.1:%s/healthz' % os.environ.get('ESP_PORT', '8000'), timeout=2)"]
ENTRYPOINT ["esp"]
CMD ["serve", "--host", "0.0.0.0", "--port", "8000", "--bundle", "/models/bundle"]
