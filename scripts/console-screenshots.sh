#!/usr/bin/env bash
# The console's screenshots in docs/images/console/ (linked from docs/console.md), taken by
# tests/browser/test_console_screenshots.py in headless chromium against a live control plane
# with a demo job. Needs what the browser tests need (scripts/browser-deps.sh).
#
#   bash scripts/console-screenshots.sh
set -euo pipefail
cd "$(dirname "$0")/.."
export TUNEFORGE_CONSOLE_SCREENSHOTS="${TUNEFORGE_CONSOLE_SCREENSHOTS:-$PWD/docs/images/console}"
"${PYTHON:-python}" -m pytest tests/browser/test_console_screenshots.py -q -p no:cacheprovider "$@"
ls -l "$TUNEFORGE_CONSOLE_SCREENSHOTS"
