#!/usr/bin/env bash
# What the browser tests (tests/browser) need: Debian's chromium and Playwright for Python.
#
#   scripts/browser-deps.sh
#
# Idempotent and quick when both are there: apt runs only when /usr/bin/chromium is missing,
# pip only when `import playwright` fails. Playwright's own browser downloads are never used
# (`playwright install` is not run): the tests launch /usr/bin/chromium.
#
# Environment:
#   PYTHON                      interpreter whose site-packages get playwright (default "python")
#   TUNEFORGE_CHROMIUM          the chromium binary the tests launch (default /usr/bin/chromium)
set -euo pipefail

PYTHON="${PYTHON:-python}"
CHROMIUM="${TUNEFORGE_CHROMIUM:-/usr/bin/chromium}"

if [[ -x "$CHROMIUM" ]]; then
    echo "browser-deps: chromium present ($CHROMIUM)"
else
    echo "browser-deps: installing Debian's chromium"
    if [[ "$(id -u)" != 0 ]] && command -v sudo > /dev/null; then
        apt=(sudo apt-get)
    else
        apt=(apt-get)
    fi
    export DEBIAN_FRONTEND=noninteractive
    "${apt[@]}" update -qq
    "${apt[@]}" install -y -qq --no-install-recommends chromium fonts-dejavu-core > /dev/null
    echo "browser-deps: $("$CHROMIUM" --version 2>/dev/null || echo "chromium installed")"
fi

if "$PYTHON" -c "import playwright.sync_api" 2> /dev/null; then
    echo "browser-deps: playwright present"
else
    echo "browser-deps: installing playwright (Python)"
    "$PYTHON" -m pip install --quiet --disable-pip-version-check --root-user-action=ignore "playwright>=1.45"
fi
