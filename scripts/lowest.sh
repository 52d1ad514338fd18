#!/usr/bin/env bash
# The lowest-versions stage: every direct dependency at the lowest version pyproject.toml allows
# (uv's --resolution lowest-direct), in a virtual environment of its own, then the unit tests on
# SQLite. It proves the lower bounds the package declares. torch stays at the build installed
# for the other stages (its lowest, 2.5, is a CUDA download of several GB; see docs/operations.md).
#
#   scripts/lowest.sh [PYTEST ARGS...]     (default: tests/unit)
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

PYTHON="${PYTHON:-python}"
venv="${TUNEFORGE_LOWEST_VENV:-$(mktemp -d -t tuneforge-lowest.XXXXXX)/venv}"
"$PYTHON" -m pip install --quiet --disable-pip-version-check --root-user-action=ignore uv
"$PYTHON" -m venv "$venv"
overrides="$(dirname "$venv")/overrides.txt"
echo "torch==$("$PYTHON" -c 'import torch; print(torch.__version__.split("+")[0])')" > "$overrides"
links=()
if [[ -d /opt/wheels ]]; then
    links=(--find-links /opt/wheels)  # this machine's local wheels (torch), as pip's configuration names them
fi
"$PYTHON" -m uv pip install --quiet --python "$venv/bin/python" "${links[@]}" --resolution lowest-direct \
    --override "$overrides" -e ".[server,postgres,s3,tracking]" "pytest>=8" "moto[server]>=5" "hypothesis>=6.130"
"$venv/bin/python" - <<'PY'
from importlib import metadata
shown = ["torch", "transformers", "peft", "tokenizers", "fastapi", "starlette", "pydantic", "sqlalchemy", "anyio",
         "httpx", "typer", "pyarrow", "numpy"]
print("lowest-direct versions: " + ", ".join(f"{name} {metadata.version(name)}" for name in shown))
PY
args=("$@")
if [[ ${#args[@]} -eq 0 ]]; then
    args=(tests/unit)
fi
# test_packaging checks this environment against constraints.txt, which pins the newest: not here
env -u TUNEFORGE_TEST_POSTGRES_URL -u TUNEFORGE_TEST_EXECUTOR TUNEFORGE_TEST_LOWEST=1 "$venv/bin/python" -m pytest -p no:cacheprovider \
    --ignore=tests/unit/test_packaging.py "${args[@]}"
