#!/usr/bin/env bash
# The lowest-versions stage: every direct dependency at the lowest version pyproject.toml allows
# (uv's --resolution lowest-direct), in a virtual environment of its own, then the unit tests on
# SQLite. It proves the lower bounds the package declares. torch stays at the build installed
# for the other stages (its lowest, 2.5, is a CUDA download of several GB; see docs/operations.md).
#
# The dependencies' environment is built once and kept under ~/.cache/tuneforge/lowest-KEY, KEY a hash
# of what pyproject.toml declares about dependencies (its build system, dependencies and extras;
# the whole file where the interpreter has no tomllib), this script, the interpreter and the torch
# build: a run whose KEY
# matches reuses it (resolving and installing ~100 packages takes half a minute with a warm uv cache,
# minutes with a cold one). The project itself is never in it: every run makes a small environment of
# its own that holds this checkout (editable) and reads the cached one's packages through a .pth file,
# so that two checkouts testing side by side each import their own code.
#
#   scripts/lowest.sh [PYTEST ARGS...]     (default: tests/unit)
#   scripts/lowest.sh --prepare            only build (or find) the cached environment, run nothing
#                                          (scripts/test.sh starts it early, beside its other work)
#
# Environment:
#   TUNEFORGE_LOWEST_CACHE   where the built environments are kept (default ~/.cache/tuneforge)
#   TUNEFORGE_LOWEST_VENV    build into this folder instead, every run (no cache)
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

PYTHON="${PYTHON:-python}"
"$PYTHON" -m uv --version >/dev/null 2>&1 \
    || "$PYTHON" -m pip install --quiet --disable-pip-version-check --root-user-action=ignore uv
uv_pip=("$PYTHON" -m uv pip install --quiet)
requirements=(".[server,postgres,s3,tracking]" "pytest>=8" "moto[server]>=5" "hypothesis>=6.130")
torch_version="$("$PYTHON" -c 'from importlib import metadata; print(metadata.version("torch").split("+")[0])')"
links=()
if [[ -d /opt/wheels ]]; then
    links=(--find-links /opt/wheels)  # this machine's local wheels (torch), as pip's configuration names them
fi

# Every direct dependency at its lowest allowed version, with the project, into the environment $1.
install_lowest() {
    local venv="$1"
    "$PYTHON" -m venv "$venv"
    echo "torch==$torch_version" > "$venv/overrides.txt"
    # --compile-bytecode: uv leaves modules uncompiled, and where PYTHONDONTWRITEBYTECODE is set
    # (as in many CI images) every process of the stage (the tests', each trainer's, each data
    # worker's) would compile transformers and the rest from source again, seconds each time
    "${uv_pip[@]}" --python "$venv/bin/python" "${links[@]}" --resolution lowest-direct --compile-bytecode \
        --override "$venv/overrides.txt" -e "${requirements[@]}"
}

site_packages() {
    "$1/bin/python" -c 'import sysconfig; print(sysconfig.get_path("purelib"))'
}

# What pyproject.toml says about dependencies, one canonical JSON line: a change elsewhere in the file
# (a tool's settings, the description) keeps the cached environment.
declared_dependencies() {
    "$PYTHON" - <<'PY'
import json, sys
try:
    import tomllib
except ImportError:  # Python 3.10: the whole file decides
    sys.stdout.write(open("pyproject.toml").read())
else:
    with open("pyproject.toml", "rb") as handle:
        data = tomllib.load(handle)
    project = data.get("project", {})
    print(json.dumps([data.get("build-system"), project.get("requires-python"), project.get("dependencies"),
                      project.get("optional-dependencies")], sort_keys=True))
PY
}

# The cached dependencies' environment for this key, built under a lock (a run beside this one
# waits for it rather than building it twice); prints its path.
cached_dependencies() {
    local key root deps
    key="$({ declared_dependencies; cat scripts/lowest.sh; echo "torch==$torch_version"; "$PYTHON" -VV; } \
        | sha256sum | cut -c1-16)"
    root="${TUNEFORGE_LOWEST_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/tuneforge}"
    deps="$root/lowest-$key"
    mkdir -p "$root"
    (
        flock 9
        if [[ ! -f "$deps/complete" ]]; then
            rm -rf "$deps"
            local started=$SECONDS
            install_lowest "$deps/venv" >&2
            # the project comes from each run's own environment, never from the shared one
            "$PYTHON" -m uv pip uninstall --quiet --python "$deps/venv/bin/python" tuneforge >&2
            touch "$deps/complete"
            echo "lowest.sh: built the lowest-direct environment $deps in $((SECONDS - started)) s" >&2
            # environments of other keys unused for a week go (a run that uses one touches it)
            find "$root" -maxdepth 1 -name 'lowest-*' -not -name "lowest-$key" -mtime +7 \
                -exec rm -rf {} + 2>/dev/null || true
        else
            echo "lowest.sh: reusing the lowest-direct environment $deps" >&2
        fi
        touch "$deps"
    ) 9> "$root/lowest.lock"
    echo "$deps/venv"
}

started=$SECONDS
if [[ "${1:-}" == --prepare ]]; then
    if [[ -z "${TUNEFORGE_LOWEST_VENV:-}" ]]; then
        cached_dependencies >/dev/null
    fi
    echo "lowest.sh: the lowest-direct environment is ready ($((SECONDS - started)) s)"
    exit 0
fi
if [[ -n "${TUNEFORGE_LOWEST_VENV:-}" ]]; then
    venv="$TUNEFORGE_LOWEST_VENV"
    install_lowest "$venv"
else
    deps_venv="$(cached_dependencies)"
    venv="$(mktemp -d -t tuneforge-lowest.XXXXXX)/venv"
    trap 'rm -rf "$(dirname "$venv")"' EXIT
    "$PYTHON" -m venv --without-pip "$venv"
    # an `import` line of a .pth file runs at start-up: the cached packages, their own .pth files included
    echo "import site; site.addsitedir('$(site_packages "$deps_venv")')" > "$(site_packages "$venv")/lowest-deps.pth"
    "${uv_pip[@]}" --python "$venv/bin/python" --no-deps -e .
fi
echo "lowest.sh: environment ready in $((SECONDS - started)) s"
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
