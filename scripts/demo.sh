#!/usr/bin/env bash
# The demo: install, then fine-tune a tiny model end to end through the API.
#   scripts/demo.sh            (TUNEFORGE_DEMO_SKIP_INSTALL=1 skips the installs)
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
PYTHON="${PYTHON:-python}"
if [[ "${TUNEFORGE_DEMO_SKIP_INSTALL:-0}" != 1 ]]; then
    pip_install=("$PYTHON" -m pip install --quiet --disable-pip-version-check --root-user-action=ignore)
    # torch first, pinned to the CPU build: unpinned it would pull a CUDA build of several GB.
    "${pip_install[@]}" "torch==2.13.0"
    "${pip_install[@]}" -e ".[server]"
    # python graders' sandbox (bubblewrap); the demo itself runs without it
    bash scripts/sandbox-deps.sh || echo "demo: bubblewrap did not install; python graders stay refused" >&2
fi
exec "$PYTHON" -m tuneforge.cli.main demo "$@"
