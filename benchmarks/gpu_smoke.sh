#!/usr/bin/env bash
# The whole workflow on a GPU host in minutes (benchmarks/gpu_smoke.py has the details):
# tiny and ~0.5B models, LoRA, QLoRA and full, on 1 GPU and on all; prints tokens/s, MFU and
# peak memory per job. On a machine without a CUDA GPU it says so and exits 0 (CI runs it so).
#   bash benchmarks/gpu_smoke.sh [--model HUB_ID_OR_PATH] [--tiny-only] [--gpus N]
# It then runs benchmarks/cotrain.py on the GPU (COTRAIN_JSON: where its figures go).
# With VLLM_URL (and VLLM_BASE_NAME, VLLM_BASE_SOURCE) set, it then checks the hand-off to that
# vLLM server (benchmarks/vllm_handoff.py has the details and how to start vLLM).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
PYTHON="${PYTHON:-python}"
if ! "$PYTHON" -c "import sys, torch; sys.exit(0 if torch.cuda.is_available() else 1)" 2>/dev/null; then
    echo "gpu_smoke: no CUDA GPU on this machine: skipped"
    exit 0
fi
"$PYTHON" -c "import torch; print('gpu_smoke:', torch.cuda.device_count(), 'x', torch.cuda.get_device_name(0))"
"$PYTHON" benchmarks/gpu_smoke.py "$@"
# co-training on one GPU (issue: 8 LoRA fine-tunes co-trained vs one at a time vs 8 processes) on a
# ~0.4B-parameter random base, whose 8-row passes do not fill the GPU; its figures go to
# docs/benchmarks-cotrain.md. A failed losses check is reported, not fatal to the smoke.
"$PYTHON" benchmarks/cotrain.py --device cuda --hidden-size 2048 --intermediate-size 5632 --layers 8 \
    --heads 16 --kv-heads 4 --steps 30 --wait-quiet 0 --retries 0 --timeout 240 \
    --json-out "${COTRAIN_JSON:-/tmp/cotrain-gpu.json}" || echo "gpu_smoke: cotrain benchmark exited $?"
if [[ -n "${VLLM_URL:-}" ]]; then
    "$PYTHON" benchmarks/vllm_handoff.py --vllm-url "$VLLM_URL" --base-name "${VLLM_BASE_NAME:?set VLLM_BASE_NAME}" \
        --base-source "${VLLM_BASE_SOURCE:?set VLLM_BASE_SOURCE}" ${VLLM_API_KEY:+--api-key "$VLLM_API_KEY"}
fi
