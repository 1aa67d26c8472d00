# syntax=docker/dockerfile:1
# ESP training: fine-tunes the bi-encoder and writes a bundle. Build from the repository root:
#   docker build -f docker/training.Dockerfile -t esp-training:0.1.0 .
#   docker run --rm -v "$PWD/artifacts:/artifacts" esp-training:0.1.0
# CPU torch by default; for GPU training build with
#   --build-arg TORCH_INDEX=https://download.pytorch.org/whl/cu128 and run with --gpus all.

ARG PYTHON_IMAGE=python:3.11.11-slim-bookworm

FROM ${PYTHON_IMAGE} AS deps
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1 PYTHONDONTWRITEBYTECODE=1
RUN python -m venv /opt/venv
ENV PATH=/opt/venv/bin:$PATH
WORKDIR /src
COPY requirements.txt pyproject.toml ./
COPY deploy/pins.py deploy/pins.py
ARG TORCH_INDEX=https://download.pytorch.org/whl/cpu
# EXTRAS="train ray": also Ray Data, for `esp index --engine ray` (k8s-ray/rayjob-esp-index.yaml)
ARG EXTRAS=train
RUN python deploy/pins.py ${EXTRAS} --exclude torch > /tmp/train.txt \
    && pip install --index-url "${TORCH_INDEX}" "$(grep -E '^torch==' requirements.txt)" \
    && pip install -r /tmp/train.txt

FROM ${PYTHON_IMAGE}
ENV PATH=/opt/venv/bin:$PATH \
    PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1 \
    HF_HUB_OFFLINE=1 \
    TRANSFORMERS_OFFLINE=1 \
    HOME=/tmp \
    MPLCONFIGDIR=/tmp/matplotlib \
    PYTHONPATH=/app
RUN groupadd --system --gid 10001 esp \
    && useradd --system --uid 10001 --gid esp --no-create-home --home-dir /nonexistent --shell /usr/sbin/nologin esp \
    && mkdir /artifacts && chown esp:esp /artifacts
COPY --from=deps /opt/venv /opt/venv
WORKDIR /app
# The shipped data and configs: training runs fully offline. The code runs from /app (not
# installed), because training finds the shipped data beside its package (esp_retrieval/../data).
COPY configs configs
COPY data data
COPY esp_retrieval/__init__.py esp_retrieval/__init__.py
COPY esp_retrieval/subspace esp_retrieval/subspace
COPY esp_retrieval/encoder esp_retrieval/encoder
COPY esp_retrieval/training esp_retrieval/training
COPY esp_retrieval/cli esp_retrieval/cli
USER 10001:10001
VOLUME ["/artifacts"]
# A batch job, not a server: nothing to probe.
HEALTHCHECK NONE
ENTRYPOINT ["python", "-m", "esp_retrieval.cli"]
CMD ["train", "--config", "configs/demo.yaml", "--out", "/artifacts/demo"]
