# syntax=docker/dockerfile:1
# ESP retrieval service on an NVIDIA GPU: the CPU image's Python and pins, with torch's CUDA
# wheel (it encodes query text on the GPU) and cupy (the engine's cupy backend). One process per
# GPU (the Helm chart gives each pod one nvidia.com/gpu). Build from the repository root:
#   docker build -f docker/service-cuda.Dockerfile -t esp-retrieval:0.1.0-cuda .
# Bake a bundle with --build-arg BUNDLE=<dir in the context>, or mount one at /models/bundle.
#
# The CUDA runtime libraries come as wheels (torch==2.13.0 from PyPI depends on the CUDA 13
# toolkit wheels, which cupy-cuda13x finds too); the driver (libcuda) is the node's, mounted by
# the NVIDIA container toolkit (NVIDIA_VISIBLE_DEVICES / NVIDIA_DRIVER_CAPABILITIES below), so
# the node needs a driver for CUDA 13. Without a usable GPU the service still starts:
# ESP_BACKEND=auto skips cupy with its reason in the log and the encoder runs on the CPU.

ARG PYTHON_IMAGE=python:3.11.11-slim-bookworm

FROM ${PYTHON_IMAGE} AS deps
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1 PYTHONDONTWRITEBYTECODE=1
RUN python -m venv /opt/venv
ENV PATH=/opt/venv/bin:$PATH
WORKDIR /src
# Dependency layer: changes only when the pins change, not with every code edit.
COPY requirements.txt pyproject.toml ./
COPY deploy/pins.py deploy/pins.py
# The serve pins of requirements.txt, torch included (PyPI's Linux wheel of the same version is
# the CUDA build); cupy is the one dependency outside requirements.txt (the CPU test machines
# cannot run it), pinned here.
ARG CUPY_VERSION=14.2.0
RUN python deploy/pins.py serve > /tmp/serve.txt \
    && pip install -r /tmp/serve.txt "cupy-cuda13x==${CUPY_VERSION}"
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
    ESP_BUNDLE=/models/bundle \
    ESP_BACKEND=auto \
    ESP_ENCODER_DEVICE=auto \
    NVIDIA_VISIBLE_DEVICES=all \
    NVIDIA_DRIVER_CAPABILITIES=compute,utility
RUN groupadd --system --gid 10001 esp \
    && useradd --system --uid 10001 --gid esp --no-create-home --home-dir /nonexistent --shell /usr/sbin/nologin esp
COPY --from=deps /opt/venv /opt/venv
COPY --from=bundle --chown=root:root /models/bundle /models/bundle
USER 10001:10001
EXPOSE 8000
HEALTHCHECK --interval=30s --timeout=3s --start-period=30s --retries=3 \
    CMD ["python", "-c", "import os, urllib.request; urllib.request.urlopen('http://127.0.0.1:%s/healthz' % os.environ.get('ESP_PORT', '8000'), timeout=2)"]
ENTRYPOINT ["esp"]
CMD ["serve", "--host", "0.0.0.0", "--port", "8000", "--bundle", "/models/bundle"]
