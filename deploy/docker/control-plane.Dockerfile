# The tuneforge control plane: API, scheduler, webhook dispatcher and inference,
# driving trainers on a Ray cluster through Ray Client.
#
#   docker build -f deploy/docker/control-plane.Dockerfile -t tuneforge-control-plane .
#
# The Ray version baked in here must be the cluster's own (Ray Client refuses a
# mismatch): build with --build-arg RAY_VERSION=<the cluster's version>.
FROM python:3.11-slim

ARG RAY_VERSION=2.60.0
ARG TORCH_VERSION=2.13.0
# CPU PyTorch: the control plane tokenizes, estimates, merges adapters for download and
# serves inference on CPU; GPUs belong to the trainers. Use a CUDA build instead if the
# control plane's pod gets a GPU for inference (TUNEFORGE_INFERENCE_DEVICE=cuda).
ARG TORCH_INDEX=https://download.pytorch.org/whl/cpu

ENV PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1 PIP_NO_CACHE_DIR=1 \
    TUNEFORGE_HOME=/var/lib/tuneforge TUNEFORGE_HOST=0.0.0.0 TUNEFORGE_PORT=8000 \
    TUNEFORGE_EXECUTOR=ray HF_HUB_DISABLE_TELEMETRY=1

RUN pip install --index-url "$TORCH_INDEX" "torch==${TORCH_VERSION}"
WORKDIR /opt/tuneforge
COPY pyproject.toml README.md constraints.txt ./
COPY src ./src
# every other package at the version the tests passed with (constraints.txt)
RUN pip install -c constraints.txt ".[server,postgres,s3,ray]" "ray[client]==${RAY_VERSION}"

RUN useradd --system --uid 10001 --home-dir /var/lib/tuneforge --create-home tuneforge
USER 10001
VOLUME ["/var/lib/tuneforge"]
EXPOSE 8000
HEALTHCHECK --interval=30s --timeout=5s CMD python -c "import urllib.request; urllib.request.urlopen('http://127.0.0.1:8000/healthz', timeout=4)"
# Migrations run at start-up; several replicas may share the database (one schedules).
ENTRYPOINT ["tuneforge", "serve"]
