# The image of the Ray cluster's nodes (KubeRay head and GPU workers): Ray, CUDA
# PyTorch, bitsandbytes for QLoRA, and tuneforge, whose trainer entry point
# (`python -m tuneforge.train SPEC`) the Ray executor starts on each node.
#
#   docker build -f deploy/docker/trainer.Dockerfile -t tuneforge-trainer .
#
# RAY_VERSION must match the control plane's image and the rest of the cluster.
ARG RAY_VERSION=2.60.0
FROM rayproject/ray:${RAY_VERSION}-py311-gpu

ARG TORCH_VERSION=2.13.0
# The CUDA build of PyTorch that matches the nodes' drivers (cu128: driver 570 or newer).
ARG TORCH_INDEX=https://download.pytorch.org/whl/cu128

ENV PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1 PIP_NO_CACHE_DIR=1 \
    HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false

RUN pip install --index-url "$TORCH_INDEX" "torch==${TORCH_VERSION}"
WORKDIR /opt/tuneforge
COPY --chown=ray:users pyproject.toml README.md constraints.txt ./
COPY --chown=ray:users src ./src
# a trainer's packages (and S3, the trackers) at the versions the tests passed with
RUN pip install -c constraints.txt ".[train,s3,tracking]" "bitsandbytes>=0.45"

# Base models are cached here by SHA (TUNEFORGE_RAY_NODE_CACHE_DIR): mount a node-local
# volume (hostPath or an emptyDir on local SSD) so the cache outlives the pod.
RUN mkdir -p /home/ray/.cache/tuneforge/base-models /tmp/tuneforge/attempts
