#!/usr/bin/env bash
# The tinker-cookbook, for tests/e2e/test_tinker_cookbook.py (its basic supervised and RL recipes
# against the training API): a no-op where it is installed.
#
# Its release that works with the SDK tuneforge serves (0.6.1) declares a dependency PyPI does not
# have (tml-renderers >= 0.4.1, needed only for two hosted model families), and the release pip would
# pick instead downgrades transformers: so the cookbook goes in without its declared dependencies,
# and what its supervised and RL recipes import goes in beside it, pinned to the versions tested.
# Without it the cookbook test skips.
set -euo pipefail
PYTHON="${PYTHON:-python}"
if "$PYTHON" -c "import tinker_cookbook, chz, math_verify" >/dev/null 2>&1; then
    exit 0
fi
pip_install=("$PYTHON" -m pip install --quiet --disable-pip-version-check --root-user-action=ignore)
"${pip_install[@]}" --no-deps "tinker-cookbook==0.6.1" \
    || { echo "cookbook-deps: tinker-cookbook is not installable here; its test will skip" >&2; exit 0; }
"${pip_install[@]}" "chz==0.4.0" "blobfile==3.3.0" "pyrage==1.4.0" "termcolor==3.3.0" "tiktoken==0.14.0" \
    "lxml==6.1.3" "pycryptodomex==3.24.2" "math-verify==0.9.0" "pylatexenc==2.11" \
    || echo "cookbook-deps: the cookbook's recipes' dependencies did not install; its test will skip" >&2
