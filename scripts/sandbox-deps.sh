#!/usr/bin/env bash
# What python graders need: bubblewrap (their sandbox) and the OS's python 3 (the interpreter the
# sandbox runs them with: the sandbox holds /usr read-only, never the platform's own environment).
#
#   scripts/sandbox-deps.sh
#
# Idempotent and quick when both are there: apt runs only when /usr/bin/bwrap or /usr/bin/python3
# is missing. Without them the platform still runs and refuses python graders (400).
# Whether this host can sandbox (user namespaces allowed) is what the platform itself checks
# (`tuneforge.graders.sandbox.available()`), not this script.
set -euo pipefail

missing=()
[[ -x /usr/bin/bwrap ]] || missing+=(bubblewrap)
[[ -x /usr/bin/python3 ]] || missing+=(python3)

if [[ ${#missing[@]} -eq 0 ]]; then
    echo "sandbox-deps: bubblewrap present ($(/usr/bin/bwrap --version))"
    exit 0
fi

echo "sandbox-deps: installing ${missing[*]} (Debian's)"
if [[ "$(id -u)" != 0 ]] && command -v sudo > /dev/null; then
    apt=(sudo apt-get)
else
    apt=(apt-get)
fi
export DEBIAN_FRONTEND=noninteractive
"${apt[@]}" update -qq
"${apt[@]}" install -y -qq --no-install-recommends "${missing[@]}" > /dev/null
echo "sandbox-deps: $(/usr/bin/bwrap --version)"
