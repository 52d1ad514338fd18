#!/usr/bin/env bash
# The GPU check, in one call, on a single-GPU host with PyTorch and CUDA and no network (8 minutes):
#   bash benchmarks/gpu_bundle.sh [--with-qlora]    # beforehand, where the network is: wheels into .whl/
#   bash benchmarks/gpu_smoke.sh                    # on the GPU host, from the repository's root
# It installs .whl/ (when there) into /tmp/site without an index, puts this checkout's src/ on the
# path when tuneforge is not installed, and runs benchmarks/gpu_cases.py: the trainer on random
# models shaped like 0.5B, 1.5B and 7B (LoRA, QLoRA where bitsandbytes is, full, FSDP2 on the GPU;
# packed rows, fused loss), printing tokens/s, MFU, peak memory and NVML's readings per case and
# writing them to GPU_SMOKE_JSON (default $OUT/gpu-cases.json where OUT is set, else
# /tmp/gpu-cases.json). On a machine without a CUDA GPU it says so and exits 0.
# Further checks, each on request (they take longer than the 8 minutes together):
#   GPU_SMOKE_COTRAIN=1    benchmarks/cotrain.py on the GPU (co-training 8 LoRA models on one base)
#   GPU_SMOKE_WORKFLOW=1   benchmarks/gpu_smoke.py: the control plane, the openai SDK, jobs on 1 GPU
#                          and all, batched inference (a ~0.5B hub model or --model PATH; needs the
#                          server extras); its arguments are this script's
#   VLLM_URL (+ VLLM_BASE_NAME, VLLM_BASE_SOURCE): the hand-off to that vLLM server
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
PYTHON="${PYTHON:-python3}"
if ! "$PYTHON" -c "import sys, torch; sys.exit(0 if torch.cuda.is_available() else 1)" 2>/dev/null; then
    echo "gpu_smoke: no CUDA GPU on this machine: skipped"
    exit 0
fi
if compgen -G ".whl/*.whl" > /dev/null; then
    "$PYTHON" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
    export PYTHONPATH="/tmp/site${PYTHONPATH:+:$PYTHONPATH}"
fi
if ! "$PYTHON" -c "import tuneforge" 2>/dev/null; then
    export PYTHONPATH="$PWD/src${PYTHONPATH:+:$PYTHONPATH}"
fi
export PYTHONUNBUFFERED=1
"$PYTHON" -c "import torch, transformers, peft; print('gpu_smoke:', torch.cuda.device_count(), 'x', \
torch.cuda.get_device_name(0), '· torch', torch.__version__, '· transformers', transformers.__version__, \
'· peft', peft.__version__)"
json_out="${GPU_SMOKE_JSON:-${OUT:-/tmp}/gpu-cases.json}"
status=0
"$PYTHON" benchmarks/gpu_cases.py --budget-s "${GPU_SMOKE_BUDGET_S:-400}" --json-out "$json_out" || status=$?
echo "gpu_smoke: cases written to $json_out (exit $status)"
if [[ "${GPU_SMOKE_COTRAIN:-0}" == 1 ]]; then
    # co-training on one GPU on a ~0.4B-parameter random base, whose 8-row passes do not fill the GPU;
    # its figures go to docs/benchmarks-cotrain.md. A failed losses check is reported, not fatal.
    "$PYTHON" benchmarks/cotrain.py --device cuda --hidden-size 2048 --intermediate-size 5632 --layers 8 \
        --heads 16 --kv-heads 4 --steps 30 --wait-quiet 0 --retries 0 --timeout 240 \
        --json-out "${COTRAIN_JSON:-${OUT:-/tmp}/cotrain-gpu.json}" || echo "gpu_smoke: cotrain benchmark exited $?"
fi
if [[ "${GPU_SMOKE_WORKFLOW:-0}" == 1 ]]; then
    "$PYTHON" benchmarks/gpu_smoke.py "$@" || status=$?
fi
if [[ -n "${VLLM_URL:-}" ]]; then
    "$PYTHON" benchmarks/vllm_handoff.py --vllm-url "$VLLM_URL" --base-name "${VLLM_BASE_NAME:?set VLLM_BASE_NAME}" \
        --base-source "${VLLM_BASE_SOURCE:?set VLLM_BASE_SOURCE}" ${VLLM_API_KEY:+--api-key "$VLLM_API_KEY"}
fi
exit "$status"
