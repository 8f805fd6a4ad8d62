#!/usr/bin/env bash
# Manage a local Qdrant server, for running Memoria on the Qdrant-server path (the embedded
# engine, the default, needs none): the twin of scripts/pg.sh.
#
#   scripts/qdrant.sh start    start it (if not running), wait until it is ready, print the export
#   scripts/qdrant.sh stop     stop it (SIGTERM, Qdrant flushes and exits); success if not running
#   scripts/qdrant.sh env      print the export line only, start nothing
#   scripts/qdrant.sh status   exit 0 if running and ready, 1 if not
#
# Typical use:  eval "$(scripts/qdrant.sh start)"
#               .venv/bin/memoria serve --qdrant-url "$MEMORIA_QDRANT_URL" --data-dir .data-qdrant
#
# stdout carries only the `export MEMORIA_QDRANT_URL=...` line so that callers can eval it;
# everything else (progress, errors) goes to stderr, the server's own output to its log.
#
# Binary: MEMORIA_TEST_QDRANT_BIN, else ../shared/qdrant/qdrant beside the repository (the one
# the tests start, tests/qdrant_server.py).
#
# Layout, under MEMORIA_TEST_QDRANT_DIR (default: <repo root>/.qdrant), also its working dir:
#   storage/ snapshots/  the server's data (kept across restarts; delete the directory to reset)
#   qdrant.log           the server's log
#   qdrant.pid           its process id and REST port, while it runs
#   .lock                serialises concurrent `start`/`stop` calls
#
# Ports: REST on MEMORIA_TEST_QDRANT_PORT; by default 26500 plus twice a number derived from the
# checkout's path (0-999), so two checkouts on one machine each get their own server and a
# repeated run in one checkout finds its server again. Below the kernel's ephemeral range
# (32768-60999 on Linux): a port there can be held, at any moment, by an outgoing connection of
# some other program, and the server would then fail to bind. gRPC on the next port, which is
# what Memoria assumes for a URL with a port (the URL's port + 1), so MEMORIA_QDRANT_URL alone is
# enough. The server listens on 127.0.0.1 only.
set -euo pipefail

SCRIPT_DIR="$(cd -- "$(dirname -- "${BASH_SOURCE[0]}")" && pwd -P)"
REPO_ROOT="$(dirname -- "$SCRIPT_DIR")"
readonly SCRIPT_DIR REPO_ROOT
# shellcheck source=scripts/lib.sh
. "$SCRIPT_DIR/lib.sh"
PORT="${MEMORIA_TEST_QDRANT_PORT:-$(checkout_port 26500 2)}"
readonly PORT_VARIABLE=MEMORIA_TEST_QDRANT_PORT PORT_LAST=65534 # gRPC on the next port
BINARY="${MEMORIA_TEST_QDRANT_BIN:-$(dirname -- "$REPO_ROOT")/shared/qdrant/qdrant}"
BASE="$(realpath -m -- "${MEMORIA_TEST_QDRANT_DIR:-$REPO_ROOT/.qdrant}")"
readonly PORT BINARY BASE
readonly PID_FILE="$BASE/qdrant.pid" LOG="$BASE/qdrant.log"
readonly READY_TIMEOUT_S=60 STOP_TIMEOUT_S=30


export_lines() {
    printf 'export MEMORIA_QDRANT_URL=http://127.0.0.1:%s\n' "$PORT"
}


# The pid and port of the server this directory's pid file names, if that process is still a
# server running in this directory (a pid can be reused by another process after a reboot).
read_pid_file() {
    [[ -f $PID_FILE ]] || return 1
    local pid port
    { read -r pid && read -r port; } <"$PID_FILE" || return 1
    [[ $pid =~ ^[0-9]+$ ]] && kill -0 "$pid" 2>/dev/null || return 1
    [[ $(readlink -- "/proc/$pid/cwd" 2>/dev/null) == "$BASE" ]] || return 1
    RUNNING_PID="$pid"
    RUNNING_PORT="$port"
}

ready() {
    curl -fsS --max-time 2 -o /dev/null "http://127.0.0.1:$1/readyz" 2>/dev/null
}



start_server() {
    [[ -x $BINARY ]] ||
        die "no Qdrant binary at $BINARY (set MEMORIA_TEST_QDRANT_BIN to one)"
    # Something else answering there would pass the readiness check below for a server that
    # never started: say so instead.
    ! curl -s --max-time 2 -o /dev/null "http://127.0.0.1:$PORT/" 2>/dev/null ||
        die "something already answers on 127.0.0.1:$PORT; set MEMORIA_TEST_QDRANT_PORT to another port"
    mkdir -p -- "$BASE/storage" "$BASE/snapshots"
    log "starting Qdrant ($BINARY) on 127.0.0.1:$PORT (gRPC $((PORT + 1))), log in $LOG"
    # Its own session (no terminal's hangup reaches it), a clean environment (no QDRANT__*
    # of the caller's), stdout and stderr to the log (the caller's $(...) must not wait for
    # it), and without fd 9: the server would otherwise hold the lock for as long as it runs.
    (
        cd -- "$BASE"
        exec env -i PATH="${PATH:-/usr/bin:/bin}" \
            QDRANT__SERVICE__HOST=127.0.0.1 \
            QDRANT__SERVICE__HTTP_PORT="$PORT" \
            QDRANT__SERVICE__GRPC_PORT="$((PORT + 1))" \
            QDRANT__STORAGE__STORAGE_PATH="$BASE/storage" \
            QDRANT__STORAGE__SNAPSHOTS_PATH="$BASE/snapshots" \
            QDRANT__TELEMETRY_DISABLED=true \
            setsid "$BINARY"
    ) </dev/null >>"$LOG" 2>&1 9>&- &
    RUNNING_PID=$!
    printf '%s\n%s\n' "$RUNNING_PID" "$PORT" >"$PID_FILE"
}

wait_ready() {
    local deadline=$((SECONDS + READY_TIMEOUT_S))
    until ready "$PORT"; do
        kill -0 "$RUNNING_PID" 2>/dev/null || fail_with_log "the server stopped before it was ready"
        ((SECONDS < deadline)) || fail_with_log "the server was not ready after ${READY_TIMEOUT_S}s"
        sleep 0.2
    done
}

cmd_start() {
    check_port
    mkdir -p -- "$BASE"
    lock
    if read_pid_file; then
        [[ $RUNNING_PORT == "$PORT" ]] ||
            die "the server in $BASE is running on port $RUNNING_PORT, not $PORT; run '$0 stop' first"
        log "already running on 127.0.0.1:$PORT"
    else
        start_server
    fi
    wait_ready
    log "ready"
    export_lines
}

cmd_stop() {
    check_port
    if ! read_pid_file; then
        log "not running"
        return 0
    fi
    lock
    # Another `stop` may have won the race for the lock.
    if ! read_pid_file; then
        log "not running"
        return 0
    fi
    log "stopping the server in $BASE (pid $RUNNING_PID)"
    kill -TERM "$RUNNING_PID" 2>/dev/null || true
    local deadline=$((SECONDS + STOP_TIMEOUT_S))
    while kill -0 "$RUNNING_PID" 2>/dev/null; do
        if ((SECONDS >= deadline)); then
            log "still running after ${STOP_TIMEOUT_S}s; killing it"
            kill -KILL "$RUNNING_PID" 2>/dev/null || true
            break
        fi
        sleep 0.2
    done
    rm -f -- "$PID_FILE"
}

cmd_status() {
    check_port
    if read_pid_file && ready "$RUNNING_PORT"; then
        log "running on 127.0.0.1:$RUNNING_PORT (storage: $BASE/storage)"
        return 0
    fi
    log "not running"
    return 1
}

case "${1:-}" in
    start) cmd_start ;;
    stop) cmd_stop ;;
    env)
        check_port
        export_lines
        ;;
    status) cmd_status ;;
    *)
        echo "usage: $0 {start|stop|env|status}" >&2
        exit 2
        ;;
esac
