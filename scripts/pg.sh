#!/usr/bin/env bash
# A throwaway PostgreSQL server for the test suite.
#
#   scripts/pg.sh start [PORT]   initialise (if needed) and start; waits until ready
#   scripts/pg.sh stop [PORT]    stop and delete the data folder
#   scripts/pg.sh url [PORT]     print the admin SQLAlchemy URL
#   scripts/pg.sh status [PORT]  exit 0 if our server on PORT accepts connections
#
# PORT defaults to $TUNEFORGE_PG_PORT or 54329. The server listens on 127.0.0.1
# only, trusts local connections (superuser "postgres", no password) and trades
# durability for speed (fsync=off): never point it at data you want to keep.
set -euo pipefail

PORT="${2:-${TUNEFORGE_PG_PORT:-54329}}"
BASE_DIR="${TUNEFORGE_PG_DIR:-/tmp/tuneforge-pg-$PORT}"
DATA_DIR="$BASE_DIR/data"
LOG_FILE="$BASE_DIR/server.log"
READY_TIMEOUT_S=30
FALLBACK_USER="tuneforge-pg"

log() { printf 'pg.sh: %s\n' "$*" >&2; }
die() { log "$*"; exit 1; }

find_bindir() {
    local dir
    if command -v pg_config >/dev/null 2>&1; then
        dir="$(pg_config --bindir 2>/dev/null || true)"
        if [[ -n "$dir" && -x "$dir/initdb" && -x "$dir/pg_ctl" ]]; then
            echo "$dir"
            return 0
        fi
    fi
    # Newest installed major version first.
    for dir in $(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -t/ -k5 -rn); do
        if [[ -x "$dir/initdb" && -x "$dir/pg_ctl" ]]; then
            echo "$dir"
            return 0
        fi
    done
    return 1
}

install_postgres() {
    [[ "$(id -u)" == 0 ]] || die "PostgreSQL is not installed and we are not root: install it (apt-get install postgresql)"
    log "PostgreSQL not found: installing it with apt-get"
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq >/dev/null
    apt-get install -y -qq postgresql >/dev/null
}

bindir() {
    local dir
    if ! dir="$(find_bindir)"; then
        install_postgres
        dir="$(find_bindir)" || die "PostgreSQL binaries still not found after installing"
    fi
    echo "$dir"
}

# initdb and the server refuse to run as root: use the postgres account (or an
# unprivileged one we create) when we are root, and ourselves otherwise.
run_user() {
    if [[ "$(id -u)" != 0 ]]; then
        id -un
    elif id postgres >/dev/null 2>&1; then
        echo postgres
    else
        if ! id "$FALLBACK_USER" >/dev/null 2>&1; then
            useradd --system --no-create-home --shell /usr/sbin/nologin "$FALLBACK_USER"
        fi
        echo "$FALLBACK_USER"
    fi
}

as_user() {
    local user="$1"
    shift
    if [[ "$(id -u)" == 0 ]]; then
        # cd first: the server account may not be allowed into root's cwd.
        (cd / && runuser -u "$user" -- "$@")
    else
        "$@"
    fi
}

is_ready() {
    "$1/pg_isready" -q -h 127.0.0.1 -p "$PORT" -t 1 >/dev/null 2>&1
}

ours_running() {
    local bin="$1" user="$2"
    [[ -f "$DATA_DIR/postmaster.pid" ]] && as_user "$user" "$bin/pg_ctl" -D "$DATA_DIR" status >/dev/null 2>&1
}

init_cluster() {
    local bin="$1" user="$2"
    rm -rf "$BASE_DIR"
    mkdir -p "$BASE_DIR"
    chmod 700 "$BASE_DIR"
    [[ "$(id -u)" == 0 ]] && chown "$user" "$BASE_DIR"
    as_user "$user" "$bin/initdb" -D "$DATA_DIR" -U postgres -E UTF8 --locale=C \
        --auth-local=trust --auth-host=trust --no-sync >"$BASE_DIR/initdb.log" 2>&1 \
        || { cat "$BASE_DIR/initdb.log" >&2; die "initdb failed"; }
    # Speed over durability: this server only ever holds test data.
    cat >>"$DATA_DIR/postgresql.conf" <<EOF

# --- tuneforge test server (scripts/pg.sh) ---
listen_addresses = '127.0.0.1'
port = $PORT
unix_socket_directories = '$BASE_DIR'
max_connections = 200
fsync = off
synchronous_commit = off
full_page_writes = off
wal_level = minimal
max_wal_senders = 0
checkpoint_timeout = 30min
shared_buffers = 128MB
log_min_messages = warning
EOF
}

cmd_start() {
    local bin user
    bin="$(bindir)"
    user="$(run_user)"
    if ours_running "$bin" "$user" && is_ready "$bin"; then
        log "already running on 127.0.0.1:$PORT"
        return 0
    fi
    if is_ready "$bin"; then
        die "port $PORT already serves a PostgreSQL we did not start; pick another: scripts/pg.sh start PORT"
    fi
    if [[ ! -f "$DATA_DIR/PG_VERSION" ]]; then
        init_cluster "$bin" "$user"
    fi
    as_user "$user" "$bin/pg_ctl" -D "$DATA_DIR" -l "$LOG_FILE" -w -t "$READY_TIMEOUT_S" start >/dev/null \
        || { tail -n 30 "$LOG_FILE" >&2 2>/dev/null || true; die "server failed to start"; }
    local waited=0
    until is_ready "$bin"; do
        ((waited++ < READY_TIMEOUT_S * 10)) || die "server did not accept connections within ${READY_TIMEOUT_S}s"
        sleep 0.1
    done
    log "started PostgreSQL $("$bin/postgres" --version | awk '{print $3}') on 127.0.0.1:$PORT (data in $DATA_DIR)"
}

cmd_stop() {
    local bin user
    if [[ ! -d "$BASE_DIR" ]]; then
        return 0
    fi
    bin="$(find_bindir)" || { rm -rf "$BASE_DIR"; return 0; }
    user="$(run_user)"
    if [[ -f "$DATA_DIR/postmaster.pid" ]]; then
        # immediate: nothing here is worth a clean shutdown checkpoint.
        as_user "$user" "$bin/pg_ctl" -D "$DATA_DIR" -m immediate -w -t 30 stop >/dev/null 2>&1 || true
    fi
    rm -rf "$BASE_DIR"
    log "stopped 127.0.0.1:$PORT"
}

cmd_status() {
    local bin user
    bin="$(find_bindir)" || return 1
    user="$(run_user)"
    ours_running "$bin" "$user" && is_ready "$bin"
}

case "${1:-}" in
    start) cmd_start ;;
    stop) cmd_stop ;;
    url) echo "postgresql+psycopg://postgres@127.0.0.1:$PORT/postgres" ;;
    status) cmd_status ;;
    *)
        echo "usage: $0 start|stop|url|status [PORT]" >&2
        exit 2
        ;;
esac
