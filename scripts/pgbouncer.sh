#!/usr/bin/env bash
# Manage a throwaway PgBouncer in transaction pooling mode in front of scripts/pg.sh's
# PostgreSQL, for the tests and benchmarks that run Memoria behind a pooler.
#
#   scripts/pgbouncer.sh start    start PostgreSQL (scripts/pg.sh) and PgBouncer, print exports
#   scripts/pgbouncer.sh stop     stop PgBouncer (PostgreSQL stays up); success if not running
#   scripts/pgbouncer.sh env      print the export line only, start nothing
#   scripts/pgbouncer.sh status   exit 0 if PgBouncer is running, 1 if not
#
# Typical use:  eval "$(scripts/pgbouncer.sh start)"
#
# PgBouncer is Debian's package (1.18, which has no support for named prepared statements in
# transaction mode), installed with apt-get when missing and we are root, as pg.sh installs
# PostgreSQL. It listens on 127.0.0.1 only, routes every database name to the test PostgreSQL
# (`* = ...`, so the tests' per-run databases work), and lets in the two roles pg.sh makes,
# memoria_app and memoria_owner, with their passwords (SCRAM, as PostgreSQL itself).
#
# stdout carries only the `export ...` line (the service role's URL through the pooler, to
# the `memoria` database); progress and errors go to stderr.
#
# Port: MEMORIA_PGBOUNCER_PORT; by default 16432 plus the number pg.sh derives from the
# checkout's path (0-999). Below 32768 on purpose: the kernel hands out 32768-60999 for
# outgoing connections, and one of those may hold the port when PgBouncer binds it.
# State (config, password file, log, pid) lives in MEMORIA_PGBOUNCER_DIR, by default
# /tmp/memoria-pgbouncer-<port>, owned by the user PgBouncer runs as (postgres when we are
# root: PgBouncer refuses to run as root).
set -euo pipefail
umask 022
unset PGHOST PGHOSTADDR PGPORT PGUSER PGDATABASE PGPASSWORD PGPASSFILE \
    PGSERVICE PGSERVICEFILE PGOPTIONS PGSSLMODE PGTARGETSESSIONATTRS

SCRIPT_DIR="$(cd -- "$(dirname -- "${BASH_SOURCE[0]}")" && pwd -P)"
REPO_ROOT="$(dirname -- "$SCRIPT_DIR")"
readonly SCRIPT_DIR REPO_ROOT
# shellcheck source=scripts/lib.sh
. "$SCRIPT_DIR/lib.sh"
PORT="${MEMORIA_PGBOUNCER_PORT:-$(checkout_port 16432 1)}"
readonly PORT_VARIABLE=MEMORIA_PGBOUNCER_PORT PORT_LAST=65535
readonly PORT
BASE="${MEMORIA_PGBOUNCER_DIR:-/tmp/memoria-pgbouncer-$PORT}"
readonly BASE
readonly BIN=/usr/sbin/pgbouncer
readonly READY_TIMEOUT_S=30

run_user() { if is_root; then echo postgres; else id -un; fi; }

# As the user PgBouncer runs as, from / (our cwd may be unreadable to it); stdout to stderr.
as_run_user() {
    if is_root; then
        (cd / && runuser -u postgres -- "$@") >&2
    else
        (cd / && "$@") >&2
    fi
}

export_lines() {
    printf 'export MEMORIA_TEST_PGBOUNCER_URL=postgresql+psycopg://memoria_app:memoria_app@127.0.0.1:%s/memoria\n' "$PORT"
}


ensure_binary() {
    [[ -x $BIN ]] && return 0
    if is_root && command -v apt-get >/dev/null; then
        log "no $BIN; installing Debian's 'pgbouncer' package"
        export DEBIAN_FRONTEND=noninteractive
        apt-get install -y -qq pgbouncer >&2 ||
            { apt-get update -qq >&2 && apt-get install -y -qq pgbouncer >&2; }
        # The package enables a system-wide service on 6432; ours is separate and nothing here
        # starts that one (no systemd in containers; on a host it is the admin's to keep).
        [[ -x $BIN ]] && return 0
    fi
    die "no PgBouncer ($BIN); install it with: sudo apt-get install pgbouncer"
}

running() {
    [[ -f $BASE/pgbouncer.pid ]] && kill -0 "$(<"$BASE/pgbouncer.pid")" 2>/dev/null
}

# The PostgreSQL port from pg.sh's export lines (…@127.0.0.1:PORT/memoria).
postgres_port() {
    local line
    line="$(printf '%s\n' "$1" | grep MEMORIA_TEST_PG_APP_URL=)" || return 1
    line="${line##*@127.0.0.1:}"
    echo "${line%%/*}"
}

write_config() {
    local pg_port="$1"
    # In the state dir, private to the run user: plain-text passwords of the test roles (the
    # ones pg.sh sets; PgBouncer needs them in clear to log in to PostgreSQL with SCRAM).
    (umask 077 && printf '"memoria_app" "memoria_app"\n"memoria_owner" "memoria_owner"\n' \
        >"$BASE/userlist.txt")
    cat >"$BASE/pgbouncer.ini" <<EOF
; Written by scripts/pgbouncer.sh; rewritten on every start.
[databases]
* = host=127.0.0.1 port=$pg_port

[pgbouncer]
listen_addr = 127.0.0.1
listen_port = $PORT
unix_socket_dir =
auth_type = scram-sha-256
auth_file = $BASE/userlist.txt
pool_mode = transaction
; Enough for the tests' servers (two pools of up to 16 connections each) to run at once,
; within the default limit of 1024 open files.
max_client_conn = 900
default_pool_size = 40
logfile = $BASE/pgbouncer.log
pidfile = $BASE/pgbouncer.pid
EOF
    if is_root; then chown -- postgres: "$BASE/userlist.txt" "$BASE/pgbouncer.ini"; fi
}

wait_ready() {
    local deadline=$((SECONDS + READY_TIMEOUT_S))
    until (exec 3<>"/dev/tcp/127.0.0.1/$PORT") 2>/dev/null; do
        # The daemon writes its pid file a moment after `-d` returns: only a pid file whose
        # process is gone means it died.
        if [[ -f $BASE/pgbouncer.pid ]] && ! running; then
            tail -n 20 -- "$BASE/pgbouncer.log" >&2 || true
            die "PgBouncer exited"
        fi
        ((SECONDS < deadline)) || die "PgBouncer not listening on $PORT after ${READY_TIMEOUT_S}s"
        sleep 0.1
    done
}

cmd_start() {
    check_port
    ensure_binary
    local pg_env pg_port
    pg_env="$("$SCRIPT_DIR/pg.sh" start)" || die "scripts/pg.sh start failed"
    pg_port="$(postgres_port "$pg_env")" || die "no port in scripts/pg.sh's output"
    if [[ ! -d $BASE ]]; then
        mkdir -m 0700 -- "$BASE"
        if is_root; then chown -- postgres: "$BASE"; fi
    fi
    [[ -d $BASE && ! -L $BASE && $(stat -c %U -- "$BASE") == "$(run_user)" ]] ||
        die "$BASE is not a directory owned by $(run_user); remove it (it is throwaway) and retry"
    lock 60
    if running; then
        grep -q "port=$pg_port\$" "$BASE/pgbouncer.ini" ||
            die "the running PgBouncer points at another PostgreSQL port; run '$0 stop' first"
        log "already running on 127.0.0.1:$PORT"
    else
        write_config "$pg_port"
        log "starting PgBouncer ($($BIN --version | head -n 1)) on 127.0.0.1:$PORT in front of 127.0.0.1:$pg_port"
        # -d: daemonize (it writes the pid file); fd 9, the lock, must not stay open in it.
        as_run_user "$BIN" -d "$BASE/pgbouncer.ini" 9>&- || {
            tail -n 20 -- "$BASE/pgbouncer.log" >&2 || true
            die "PgBouncer did not start"
        }
        wait_ready
    fi
    log "ready (pool_mode=transaction)"
    export_lines
}

cmd_stop() {
    check_port
    if ! running; then
        log "not running"
        return 0
    fi
    local pid
    pid="$(<"$BASE/pgbouncer.pid")"
    log "stopping PgBouncer (pid $pid)"
    kill -INT "$pid" # SIGINT: PgBouncer's immediate shutdown
    local deadline=$((SECONDS + READY_TIMEOUT_S))
    while kill -0 "$pid" 2>/dev/null; do
        ((SECONDS < deadline)) || die "PgBouncer (pid $pid) did not stop"
        sleep 0.1
    done
}

cmd_status() {
    check_port
    if running; then
        log "running on 127.0.0.1:$PORT (state: $BASE)"
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
