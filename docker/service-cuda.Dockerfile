# syntax=docker/dockerfile:1
# ESP retrieval service on an NVIDIA GPU: CUDA runtime base, cupy engine backend, one process
# per GPU (the Helm chart gives each pod one nvidia.com/gpu). Build from the repository root:
#   docker build -f docker/service-cuda.Dockerfile -t esp-retrieval:0.1.0-cuda .
# Bake a bundle with --build-arg BUNDLE=<dir in the context>, or mount one at /models/bundle.

ARG CUDA_IMAGE=nvidia/cuda:12.8.1-runtime-ubuntu24.04

FROM ${CUDA_IMAGE} AS deps
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1 PYTHONDONTWRITEBYTECODE=1 \
    DEBIAN_FRONTEND=noninteractive
# Python from the distribution: the CUDA images ship none. The base tag pins the distribution;
# its security updates move the exact package versions, so they are not pinned here.
# hadolint ignore=DL3008
RUN apt-get update \
    && apt-get install -y --no-install-recommends python3 python3-venv \
    && rm -rf /var/lib/apt/lists/*
RUN python3 -m venv /opt/venv
ENV PATH=/opt/venv/bin:$PATH
WORKDIR /src
COPY requirements.txt pyproject.toml ./
COPY deploy/pins.py deploy/pins.py
# The PyPI torch wheel is the CUDA build (it encodes query text on the GPU); cupy scores on it.
# cupy is the one dependency outside requirements.txt (the CPU test machines cannot run it).
ARG CUPY_VERSION=13.6.0
RUN python deploy/pins.py serve > /tmp/serve.txt \
    && pip install -r /tmp/serve.txt "cupy-cuda12x==${CUPY_VERSION}"
COPY subspace subspace
COPY encoder encoder
COPY service service
COPY esp_cli esp_cli
RUN pip install --no-deps .

FROM ${CUDA_IMAGE}
ARG BUNDLE=docker/empty-bundle
ENV DEBIAN_FRONTEND=noninteractive
# hadolint ignore=DL3008
RUN apt-get update \
    && apt-get install -y --no-install-recommends python3 \
    && rm -rf /var/lib/apt/lists/* \
    && groupadd --system --gid 10001 esp \
    && useradd --system --uid 10001 --gid esp --no-create-home --home-dir /nonexistent --shell /usr/sbin/nologin esp
ENV PATH=/opt/venv/bin:$PATH \
    PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1 \
    HF_HUB_OFFLINE=1 \
    TRANSFORMERS_OFFLINE=1 \
    HOME=/tmp \
    ESP_HOST=0.0.0.0 \
    ESP_PORT=8000 \
    ESP_BUNDLE=/models/bundle \
    ESP_BACKEND=cupy \
    NVIDIA_VISIBLE_DEVICES=all \
    NVIDIA_DRIVER_CAPABILITIES=compute,utility
COPY --from=deps /opt/venv /opt/venv
COPY --chown=root:root ${BUNDLE} /models/bundle
USER 10001:10001
EXPOSE 8000
HEALTHCHECK --interval=30s --timeout=3s --start-period=30s --retries=3 \
    CMD ["python", "-c", "import os, urllib.request; urllib.request.urlopen('http://127.0.0.1:%s/healthz' % os.environ.get('ESP_PORT', '8000'), timeout=2)"]
ENTRYPOINT ["esp"]
CMD ["serve", "--host", "0.0.0.0", "--port", "8000", "--bundle", "/models/bundle"]
