#!/usr/bin/env bash
# The project's test command.
#
#   scripts/test.sh [PYTEST ARGS...]     e.g. scripts/test.sh tests/unit -x
#
# Installs the package with its dev extras, then runs pytest once per stage:
#   sqlite    the whole suite on SQLite (the embedded default)
#   postgres  the whole suite on a throwaway PostgreSQL started by scripts/pg.sh
#             (TUNEFORGE_TEST_POSTGRES_URL set), stopped again on exit; the
#             end-to-end tests the ray stage runs are left to it when it runs
#   ray       the slower cluster stage: the end-to-end suite with the Ray executor
#             (a Ray cluster of this host) and the S3 store (moto), on that
#             PostgreSQL, plus the Ray tests (placement, multi-node, node loss,
#             restart); TUNEFORGE_TEST_EXECUTOR=ray. Unless PYTEST ARGS name
#             tests, it runs tests/e2e and tests/integration.
#   lowest    every direct dependency at the lowest version pyproject.toml allows, in a
#             virtual environment of its own (scripts/lowest.sh, with uv), then the unit
#             tests on SQLite: it checks the declared lower bounds. Run on demand
#             (TUNEFORGE_TEST_BACKENDS=lowest) until its bounds are settled (docs/operations.md).
# The sqlite and postgres stages run side by side where the machine has two cores or more
# (TUNEFORGE_TEST_PARALLEL=0: one after the other); the ray and lowest stages run after them.
# Exits non-zero if any run failed.
#
# Each invocation starts its own server on a free port, so that runs side by
# side on one machine do not stop each other's server; set TUNEFORGE_PG_PORT
# to use a fixed port instead (a server already running there is reused and
# left running).
#
# Environment:
#   TUNEFORGE_TEST_BACKENDS       runs to do, in order (default "sqlite postgres ray")
#   TUNEFORGE_TEST_SKIP_INSTALL=1 skip the pip installs (quick local loops)
#   TUNEFORGE_TEST_PARALLEL=0     run the sqlite and postgres stages one after the other
#   TUNEFORGE_PG_PORT             port of the test PostgreSQL (default: a free one)
#   PYTHON                        interpreter to use (default "python")
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."

PYTHON="${PYTHON:-python}"
BACKENDS="${TUNEFORGE_TEST_BACKENDS:-sqlite postgres ray}"

header() {
    printf '\n==============================================================\n'
    printf '  %s\n' "$*"
    printf '==============================================================\n'
}

for backend in $BACKENDS; do
    case "$backend" in
        sqlite | postgres | ray | lowest) ;;
        *)
            echo "scripts/test.sh: unknown backend '$backend' in TUNEFORGE_TEST_BACKENDS (use sqlite, postgres, ray, lowest)" >&2
            exit 2
            ;;
    esac
done

if [[ "${TUNEFORGE_TEST_SKIP_INSTALL:-0}" != 1 ]]; then
    header "installing tuneforge[dev]"
    pip_install=("$PYTHON" -m pip install --quiet --disable-pip-version-check --root-user-action=ignore)
    # torch first, pinned: left to resolve on its own it would pull a CUDA build.
    "${pip_install[@]}" "torch==2.13.0"
    "${pip_install[@]}" -e '.[dev]'
fi
# the browser tests' Chromium (Debian's) and Playwright: a no-op when both are there
PYTHON="$PYTHON" bash scripts/browser-deps.sh

pg_started=0
pg_port=""
stop_pg() {
    if [[ "$pg_started" == 1 ]]; then
        bash scripts/pg.sh stop "$pg_port" || true
    fi
}
background_pid=""
cleanup() {
    # a pass still running in the background (the script was interrupted) ends with it
    if [[ -n "$background_pid" ]]; then
        pkill -TERM -P "$background_pid" 2>/dev/null || true
        kill "$background_pid" 2>/dev/null || true
    fi
    stop_pg
}
trap cleanup EXIT
# Ctrl-C stops the whole script (and so the server), not just the current pytest.
trap 'exit 130' INT
trap 'exit 143' TERM

free_port() {
    "$PYTHON" -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
}

if [[ " $BACKENDS " == *" postgres "* || " $BACKENDS " == *" ray "* ]]; then
    header "starting PostgreSQL for the postgres and ray runs"
    pg_port="${TUNEFORGE_PG_PORT:-$(free_port)}"
    if bash scripts/pg.sh status "$pg_port"; then
        echo "scripts/test.sh: reusing the PostgreSQL already running on port $pg_port"
    else
        pg_started=1
        bash scripts/pg.sh start "$pg_port"
    fi
    pg_url="$(bash scripts/pg.sh url "$pg_port")"
fi

# Whether the pytest arguments name tests (a file or folder, maybe with ::node) rather than
# only options.
has_test_path() {
    local arg
    for arg in "$@"; do
        if [[ "$arg" != -* && -e "${arg%%::*}" ]]; then
            return 0
        fi
    done
    return 1
}

# One stage's pytest run; its exit code is the function's.
run_stage() {
    local backend="$1"
    shift
    if [[ "$backend" == sqlite ]]; then
        env -u TUNEFORGE_TEST_POSTGRES_URL -u TUNEFORGE_TEST_EXECUTOR "$PYTHON" -m pytest "$@"
    elif [[ "$backend" == lowest ]]; then
        local args=("$@")
        if ! has_test_path "$@"; then
            args+=(tests/unit)
        fi
        PYTHON="$PYTHON" bash scripts/lowest.sh "${args[@]}"
    elif [[ "$backend" == ray ]]; then
        local args=("$@")
        if ! has_test_path "$@"; then
            args+=(tests/e2e tests/integration)
        fi
        TUNEFORGE_TEST_EXECUTOR=ray TUNEFORGE_TEST_POSTGRES_URL="$pg_url" "$PYTHON" -m pytest "${args[@]}"
    else
        # the ray stage runs the end-to-end suite on PostgreSQL as well: this pass then leaves it out
        local e2e_on_ray=0
        if [[ " $BACKENDS " == *" ray "* ]]; then
            e2e_on_ray=1
        fi
        env -u TUNEFORGE_TEST_EXECUTOR TUNEFORGE_TEST_E2E_ON_RAY="$e2e_on_ray" TUNEFORGE_TEST_POSTGRES_URL="$pg_url" \
            "$PYTHON" -m pytest "$@"
    fi
}

stage_title() {
    case "$1" in
        sqlite) echo "pytest on SQLite" ;;
        postgres) echo "pytest on PostgreSQL ($pg_url)" ;;
        ray) echo "pytest on Ray + S3 + PostgreSQL: the end-to-end suite and the Ray tests (slower stage)" ;;
        lowest) echo "pytest tests/unit with every direct dependency at its lowest allowed version" ;;
    esac
}

summary=()
failed=0
ran_tests=0
record() {
    case "$2" in
        0) summary+=("$1=ok"); ran_tests=1 ;;
        5) summary+=("$1=no-tests-collected") ;;
        *) summary+=("$1=FAILED(exit $2)"); failed=1 ;;
    esac
}

# The SQLite and PostgreSQL passes are independent (each test has its own database, temp folder
# and ports): on a machine with two cores or more they run side by side, each with a temp folder
# of its own; the SQLite pass's output follows the PostgreSQL pass's. TUNEFORGE_TEST_PARALLEL=0
# runs every stage one after the other.
side_by_side=0
if [[ "${TUNEFORGE_TEST_PARALLEL:-1}" == 1 && " $BACKENDS " == *" sqlite "* && " $BACKENDS " == *" postgres "* \
      && "$(nproc 2>/dev/null || echo 1)" -ge 2 ]]; then
    side_by_side=1
fi

stages_done=" "
if [[ "$side_by_side" == 1 ]]; then
    stage_tmp="$(mktemp -d -t tuneforge-test-stages.XXXXXX)"
    header "$(stage_title sqlite) (in the background, beside the PostgreSQL pass; its output follows)"
    run_stage sqlite --basetemp="$stage_tmp/sqlite" "$@" > "$stage_tmp/sqlite.log" 2>&1 &
    background_pid=$!
    header "$(stage_title postgres)"
    set +e
    run_stage postgres --basetemp="$stage_tmp/postgres" "$@"
    postgres_rc=$?
    wait "$background_pid"
    sqlite_rc=$?
    background_pid=""
    set -e
    header "$(stage_title sqlite): its output"
    cat "$stage_tmp/sqlite.log"
    rm -rf "$stage_tmp"
    record sqlite "$sqlite_rc"
    record postgres "$postgres_rc"
    stages_done=" sqlite postgres "
fi

for backend in $BACKENDS; do
    if [[ "$stages_done" == *" $backend "* ]]; then
        continue
    fi
    header "$(stage_title "$backend")"
    set +e
    run_stage "$backend" "$@"
    rc=$?
    set -e
    record "$backend" "$rc"
done

header "results: ${summary[*]}"
if [[ "$failed" == 1 ]]; then
    exit 1
fi
if [[ "$ran_tests" == 0 ]]; then
    echo "scripts/test.sh: no run collected any test" >&2
    exit 5
fi
exit 0
