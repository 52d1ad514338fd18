#!/usr/bin/env bash
# Fetch, where the network is, the wheels a GPU host without one needs to run
# benchmarks/gpu_smoke.sh: the Python packages the trainer imports that a CUDA image with PyTorch,
# transformers, peft and tokenizers usually lacks (pydantic and its own, pydantic-settings,
# google-re2), for the host's Python (3.12 by default) on x86-64 Linux, into .whl/ (ignored by git).
# gpu_smoke.sh installs them from there into /tmp/site, without any index, before it runs.
#
#   bash benchmarks/gpu_bundle.sh                     # the trainer's wheels (~5 MB)
#   bash benchmarks/gpu_bundle.sh --with-qlora        # and bitsandbytes (QLoRA cases; ~43 MB more)
#   PYVER=3.11 bash benchmarks/gpu_bundle.sh          # for another Python on the GPU host
#
# The versions are the ones installed here (pip show), so the GPU host runs what the tests ran.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
PYTHON="${PYTHON:-python}"
PYVER="${PYVER:-3.12}"
WHEELS=".whl"
with_qlora=0
for arg in "$@"; do
    case "$arg" in
        --with-qlora) with_qlora=1 ;;
        *) echo "gpu_bundle: unknown argument $arg" >&2; exit 2 ;;
    esac
done
# .whl/ travels with the working tree but never into a commit
if [[ -d .git ]] && ! grep -qx '/.whl/' .git/info/exclude 2>/dev/null; then
    echo '/.whl/' >> .git/info/exclude
fi
version() {  # the installed version of a distribution, or nothing
    "$PYTHON" -c "import importlib.metadata as m, sys
try: print(m.version(sys.argv[1]))
except m.PackageNotFoundError: pass" "$1"
}
packages=(pydantic pydantic-core pydantic-settings python-dotenv annotated-types typing-inspection google-re2)
if [[ "$with_qlora" == 1 ]]; then
    packages+=(bitsandbytes)
fi
rm -rf "$WHEELS"
mkdir -p "$WHEELS"
for name in "${packages[@]}"; do
    pinned="$name"
    installed="$(version "$name")"
    if [[ -n "$installed" ]]; then
        pinned="$name==$installed"
    fi
    "$PYTHON" -m pip download --quiet --disable-pip-version-check --no-deps --only-binary=:all: \
        --python-version "$PYVER" --implementation cp \
        --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_24_x86_64 \
        --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 --platform manylinux1_x86_64 \
        -d "$WHEELS" "$pinned"
done
ls -l "$WHEELS"
total_kib="$(du -sk "$WHEELS" | cut -f1)"
echo "gpu_bundle: ${#packages[@]} wheels for Python $PYVER in $WHEELS ($((total_kib / 1024)) MiB)"
