#!/usr/bin/env bash
# The demo: install, then fine-tune a tiny model end to end through the API.
#   scripts/demo.sh            (TUNEFORGE_DEMO_SKIP_INSTALL=1 skips the installs; a torch already installed is kept)
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
PYTHON="${PYTHON:-python}"
if [[ "${TUNEFORGE_DEMO_SKIP_INSTALL:-0}" != 1 ]]; then
    pip_install=("$PYTHON" -m pip install --quiet --disable-pip-version-check --root-user-action=ignore)
    # torch first, its CPU build unless this machine has an NVIDIA GPU: PyPI's Linux wheel is the CUDA
    # build (with its nvidia-* libraries, gigabytes). TUNEFORGE_TORCH_INDEX picks another index.
    if ! "$PYTHON" -c "import torch" 2>/dev/null; then
        if [[ -n "${TUNEFORGE_TORCH_INDEX:-}" ]]; then
            "${pip_install[@]}" --index-url "$TUNEFORGE_TORCH_INDEX" "torch==2.13.0"
        elif command -v nvidia-smi >/dev/null 2>&1; then
            "${pip_install[@]}" "torch==2.13.0"   # the CUDA build
        elif ! "${pip_install[@]}" --index-url https://download.pytorch.org/whl/cpu "torch==2.13.0"; then
            echo "demo: the CPU build's index (download.pytorch.org) is unreachable: installing torch from the" \
                 "default index, which on Linux is the CUDA build (several GB)" >&2
            "${pip_install[@]}" "torch==2.13.0"
        fi
    fi
    "${pip_install[@]}" -e ".[server]"
    # python graders' sandbox (bubblewrap); the demo itself runs without it
    bash scripts/sandbox-deps.sh || echo "demo: bubblewrap did not install; python graders stay refused" >&2
fi
exec "$PYTHON" -m tuneforge.cli.main demo "$@"
