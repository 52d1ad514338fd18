#!/usr/bin/env bash
# The project's test command.
#
#   scripts/test.sh [PYTEST ARGS...]     e.g. scripts/test.sh tests/unit -x
#
# Installs the package with its dev extras, runs the static checks (ruff, mypy), then runs pytest
# once per stage:
#   sqlite    the whole suite on SQLite (the embedded default)
#   postgres  the whole suite on a throwaway PostgreSQL started by scripts/pg.sh
#             (TUNEFORGE_TEST_POSTGRES_URL set), stopped again on exit; the
#             end-to-end tests the ray stage runs are left to it when it runs
#   ray       the slower cluster stage: the end-to-end tests whose flow differs by executor
#             (marked both_executors: launch, poll, cancel, preemption, objects a later job
#             reads) with the Ray executor (a Ray cluster of this host) and the S3 store
#             (moto), on that PostgreSQL, plus the Ray tests (placement, multi-node, node
#             loss, restart), and the multi-process training tests (marked distributed,
#             which the sqlite stage then leaves to it); TUNEFORGE_TEST_EXECUTOR=ray.
#             Unless PYTEST ARGS name tests, it runs tests/e2e, tests/integration
#             and tests/unit/train/test_distributed.py.
#   lowest    every direct dependency at the lowest version pyproject.toml allows, in a
#             virtual environment of its own (scripts/lowest.sh, with uv; the dependencies are
#             kept under ~/.cache/tuneforge until those pyproject.toml declares change, and built
#             in the background from the start, beside the static checks), then the unit
#             tests on SQLite but the distributed ones (torch is not lowered): it checks the
#             declared lower bounds (docs/operations.md).
# On a machine with two cores or more the stages run in two lanes side by side, each as long as
# the other: the sqlite stage's tests outside tests/unit (and tests/unit/serve), then the ray
# stage in the foreground; postgres, the rest of the sqlite stage's tests/unit, then lowest in the
# background, whose output follows
# (TUNEFORGE_TEST_PARALLEL=0: every stage one after the other, the sqlite stage in one run).
# Exits non-zero if any run failed.
#
# Each invocation starts its own server on a free port, so that runs side by
# side on one machine do not stop each other's server; set TUNEFORGE_PG_PORT
# to use a fixed port instead (a server already running there is reused and
# left running).
#
# Environment:
#   TUNEFORGE_TEST_BACKENDS       runs to do (default "sqlite postgres ray lowest")
#   TUNEFORGE_TEST_SKIP_INSTALL=1 skip the pip installs (quick local loops)
#   TUNEFORGE_TEST_PARALLEL=0     run the stages one after the other
#   TUNEFORGE_PG_PORT             port of the test PostgreSQL (default: a free one)
#   PYTHON                        interpreter to use (default "python")
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."

PYTHON="${PYTHON:-python}"
BACKENDS="${TUNEFORGE_TEST_BACKENDS:-sqlite postgres ray lowest}"

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
    # torch first, pinned, with pip and so with the machine's pip configuration (where its torch
    # builds lie): left to resolve on its own it would pull a CUDA build.
    "${pip_install[@]}" "torch==2.13.0"
    # The rest with uv (which the lowest stage uses too), where it is there or installs: with the
    # packages already in place it checks them in ~2 s where pip takes ~13 s (resolution, and an
    # isolated build environment for the editable wheel); it keeps the torch installed above.
    if "$PYTHON" -m uv --version >/dev/null 2>&1 || "${pip_install[@]}" uv; then
        "$PYTHON" -m uv pip install --quiet --python "$("$PYTHON" -c 'import sys; print(sys.executable)')" -e '.[dev]'
    else
        "${pip_install[@]}" -e '.[dev]'
    fi
fi
# The project's own modules compiled once, here: an editable install leaves them as source, and
# where PYTHONDONTWRITEBYTECODE is set (as in many CI images) each of the hundreds of processes
# the suite starts (trainers, CLI runs, API workers, data workers) would compile them again.
"$PYTHON" -m compileall -q -j 0 src >/dev/null
# Likewise the test modules, which pytest rewrites (its assertions) and caches under tests/ only
# where writing bytecode is allowed: each stage's pytest run (and the lowest stage's) then reads
# what the first one wrote instead of rewriting ~300 modules again (~8 s of CPU a run).
unset PYTHONDONTWRITEBYTECODE
# the browser tests' Chromium (Debian's) and Playwright: a no-op when both are there
PYTHON="$PYTHON" bash scripts/browser-deps.sh
# python graders' sandbox (bubblewrap) and the OS's python it runs them with: a no-op when both
# are there; without them the sandbox tests would skip
bash scripts/sandbox-deps.sh
# the tinker-cookbook, whose recipes an end-to-end test runs against the training API: a no-op when
# it is there; without it that test skips
PYTHON="$PYTHON" bash scripts/cookbook-deps.sh

# The lowest stage's environment (scripts/lowest.sh) is built now, in the background, beside the
# static checks and the first stages: on a machine without it cached, resolving and downloading its
# ~100 packages is mostly waiting on the network. Its lock makes the stage wait for it if needed.
lowest_prepare_pid=""
lowest_prepare_log=""
if [[ " $BACKENDS " == *" lowest "* ]]; then
    lowest_prepare_log="$(mktemp -t tuneforge-lowest-prepare.XXXXXX)"
    PYTHON="$PYTHON" bash scripts/lowest.sh --prepare > "$lowest_prepare_log" 2>&1 &
    lowest_prepare_pid=$!
    trap 'kill "$lowest_prepare_pid" 2>/dev/null || true; rm -f "$lowest_prepare_log"' EXIT
fi

# static checks before any stage: a lint or type error fails the run in seconds, not after the suite
header "static checks: ruff, mypy, import-linter (each configured in pyproject.toml)"
"$PYTHON" -m ruff check src tests benchmarks scripts
"$PYTHON" -m mypy
# the layers of docs/architecture.md and the forbidden imports (contracts in pyproject.toml)
"$PYTHON" -c 'import sys; from importlinter.cli import lint_imports; sys.exit(lint_imports(no_cache=True))'

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
    if [[ -n "$lowest_prepare_pid" ]]; then
        kill "$lowest_prepare_pid" 2>/dev/null || true
    fi
    if [[ -n "$lowest_prepare_log" ]]; then
        rm -f "$lowest_prepare_log"
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
        # the ray stage runs the multi-process training tests when it runs: this pass then leaves them
        local distributed_on_ray=0
        if [[ " $BACKENDS " == *" ray "* ]]; then
            distributed_on_ray=1
        fi
        env -u TUNEFORGE_TEST_POSTGRES_URL -u TUNEFORGE_TEST_EXECUTOR \
            TUNEFORGE_TEST_DISTRIBUTED_ON_RAY="$distributed_on_ray" "$PYTHON" -m pytest "$@"
    elif [[ "$backend" == lowest ]]; then
        if [[ -n "$lowest_prepare_log" ]]; then
            sed 's/^/(prepared in the background) /' "$lowest_prepare_log"
        fi
        local args=("$@")
        if ! has_test_path "$@"; then
            args+=(tests/unit)
        fi
        PYTHON="$PYTHON" bash scripts/lowest.sh "${args[@]}"
    elif [[ "$backend" == ray ]]; then
        local args=("$@")
        if ! has_test_path "$@"; then
            args+=(tests/e2e tests/integration tests/unit/train/test_distributed.py)
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
        sqlite:rest) echo "pytest on SQLite: every test outside tests/unit, with ${SQLITE_FIRST_UNIT[*]} (the sqlite stage's first part)" ;;
        sqlite:unit) echo "pytest on SQLite: the rest of tests/unit (the sqlite stage's second part)" ;;
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

# The stages are independent (each test has its own database, temp folder and ports): on a
# machine with two cores or more they run in two lanes side by side, each part with a temp folder
# of its own. The sqlite stage, the longest, runs then as two parts, one in each lane (see
# sqlite_first_part), unless the arguments name tests. The background lane writes to a log that is
# printed once the foreground lane is done. TUNEFORGE_TEST_PARALLEL=0 runs every stage one after
# the other.
in_backends() {
    [[ " $BACKENDS " == *" $1 "* ]]
}
pytest_args=("$@")
foreground_parts=()
background_parts=()
if [[ "${TUNEFORGE_TEST_PARALLEL:-1}" == 1 && "$(nproc 2>/dev/null || echo 1)" -ge 2 ]]; then
    if in_backends sqlite; then
        if has_test_path "${pytest_args[@]}"; then
            foreground_parts+=(sqlite)
        else
            foreground_parts+=(sqlite:rest)
        fi
    fi
    if in_backends ray; then foreground_parts+=(ray); fi
    if in_backends postgres; then background_parts+=(postgres); fi
    if in_backends sqlite && ! has_test_path "${pytest_args[@]}"; then background_parts+=(sqlite:unit); fi
    if in_backends lowest; then background_parts+=(lowest); fi
fi
if [[ ${#foreground_parts[@]} -eq 0 || ${#background_parts[@]} -eq 0 ]]; then
    foreground_parts=()
    background_parts=()
    for backend in $BACKENDS; do
        foreground_parts+=("$backend")
    done
fi

# The sqlite stage's first part: every test folder and file of tests/ but tests/unit, and the
# folders of tests/unit in SQLITE_FIRST_UNIT; its second part is the rest of tests/unit (the two
# lanes take about as long: docs/testing.md has the figures they were balanced on).
SQLITE_FIRST_UNIT=(tests/unit/serve)
sqlite_first_part() {
    local path
    for path in tests/*; do
        case "${path#tests/}" in
            unit | __* | .*) ;;
            *) if [[ -d "$path" || "$path" == tests/test_*.py ]]; then echo "$path"; fi ;;
        esac
    done
    printf '%s\n' "${SQLITE_FIRST_UNIT[@]}"
}

# Runs one part: a stage, or half of the sqlite stage.
run_part() {
    local part="$1"
    shift
    case "$part" in
        sqlite:unit) run_stage sqlite "$@" tests/unit "${SQLITE_FIRST_UNIT[@]/#/--ignore=}" ;;
        sqlite:rest) mapfile -t first < <(sqlite_first_part); run_stage sqlite "$@" "${first[@]}" ;;
        *) run_stage "$part" "$@" ;;
    esac
}

# Runs the named parts one after the other, each part's exit code on a line "PART=RC" of the
# file $1 (the background lane cannot set this shell's variables).
run_lane() {
    local codes="$1" base="$2"
    shift 2
    local part rc
    for part in "$@"; do
        header "$(stage_title "$part")"
        set +e
        run_part "$part" --basetemp="$base/${part/:/-}" "${pytest_args[@]}"
        rc=$?
        set -e
        echo "$part=$rc" >> "$codes"
    done
}

stage_tmp="$(mktemp -d -t tuneforge-test-stages.XXXXXX)"
if [[ ${#background_parts[@]} -gt 0 ]]; then
    header "in the background, beside the other stages (output follows): ${background_parts[*]}"
    run_lane "$stage_tmp/background.codes" "$stage_tmp" "${background_parts[@]}" > "$stage_tmp/background.log" 2>&1 &
    background_pid=$!
fi
run_lane "$stage_tmp/foreground.codes" "$stage_tmp" "${foreground_parts[@]}"
if [[ -n "$background_pid" ]]; then
    set +e
    wait "$background_pid"
    set -e
    background_pid=""
    header "the background lane's output (${background_parts[*]})"
    cat "$stage_tmp/background.log"
fi
# A stage's code: a failure of any of its parts, else 0 if one ran tests, else 5 (none collected);
# a part that never reported failed.
stage_code() {
    local backend="$1" line code="" expected=0 seen=0
    for part in "${foreground_parts[@]}" "${background_parts[@]}"; do
        if [[ "$part" == "$backend" || "$part" == "$backend":* ]]; then
            expected=$((expected + 1))
        fi
    done
    while IFS= read -r line; do
        seen=$((seen + 1))
        case "${line#*=}" in
            0) [[ "$code" == "" || "$code" == 5 ]] && code=0 ;;
            5) [[ "$code" == "" ]] && code=5 ;;
            *) code="${line#*=}"; break ;;
        esac
    done < <(grep -hE "^$backend(:[a-z]+)?=" "$stage_tmp"/*.codes 2>/dev/null || true)
    if [[ "$seen" -lt "$expected" && ( "$code" == "" || "$code" == 0 || "$code" == 5 ) ]]; then
        code=1
    fi
    echo "${code:-1}"
}
for backend in $BACKENDS; do
    record "$backend" "$(stage_code "$backend")"
done
rm -rf "$stage_tmp"

header "results: ${summary[*]}"
if [[ "$failed" == 1 ]]; then
    exit 1
fi
if [[ "$ran_tests" == 0 ]]; then
    echo "scripts/test.sh: no run collected any test" >&2
    exit 5
fi
exit 0
