#!/usr/bin/env bash
# Manage a throwaway local PostgreSQL server for tests and benchmarks.
#
#   scripts/pg.sh start    start (initialising on first use), ensure roles, print exports
#   scripts/pg.sh stop     stop it (fast mode); success if it was not running
#   scripts/pg.sh env      print the export lines only, start nothing
#   scripts/pg.sh status   exit 0 if running, 1 if not
#
# Typical use:  eval "$(scripts/pg.sh start)"
#
# Durability: for tests the server runs with fsync, synchronous_commit and full_page_writes
# off (several times faster set-up and teardown; nothing here must survive a power cut). With
# MEMORIA_PG_DURABLE=1 they stay on, as on a server a user runs: the benchmarks' figures are
# measured that way (bench/harness.py starts such a cluster of its own). The setting applies
# when the server starts; `start` on a running server says which mode it runs in and refuses a
# mismatch.
#
# stdout carries only the two `export ...` lines so that callers can eval it;
# everything else (progress, errors, server output) goes to stderr.
#
# Layout, under MEMORIA_PG_DIR (default: <repo root>/.pg):
#   data/                the cluster (owned by the server user)
#   run/                 unix socket directory (owned by the server user, 0700)
#   server.log           the server's log
#   superuser.password   random password of the `postgres` superuser (TCP only;
#                        the socket uses trust, so normally nobody needs it)
#   .lock                serialises concurrent `start`/`stop` calls
#
# Port: MEMORIA_PG_PORT; by default 12432 plus a number derived from the checkout's path
# (0-999), so two checkouts on one machine each get their own server and a repeated run in
# one checkout finds its server again. Away from a system cluster on 5432 either way, and
# below 32768 on purpose: the kernel hands out 32768-60999 to outgoing connections, one of which
# could hold the port when the server binds it (scripts/qdrant.sh met that in CI).
# The server listens on 127.0.0.1 only.
set -euo pipefail

# Predictable permissions for the directories we create, whatever the caller's
# umask: the server user (postgres, when we are root) must be able to traverse
# them. Secrets get their own tighter umask where they are written.
umask 022

# Connection settings in the caller's environment (PGHOST, PGPORT, PGUSER,
# PGOPTIONS, ...) would silently redirect our own psql/pg_isready/pg_ctl calls;
# every call below passes what it needs explicitly.
unset PGHOST PGHOSTADDR PGPORT PGUSER PGDATABASE PGPASSWORD PGPASSFILE \
    PGSERVICE PGSERVICEFILE PGOPTIONS PGDATA PGSSLMODE PGTARGETSESSIONATTRS

SCRIPT_DIR="$(cd -- "$(dirname -- "${BASH_SOURCE[0]}")" && pwd -P)"
REPO_ROOT="$(dirname -- "$SCRIPT_DIR")"
readonly SCRIPT_DIR REPO_ROOT
# shellcheck source=scripts/lib.sh
. "$SCRIPT_DIR/lib.sh"
PORT="${MEMORIA_PG_PORT:-$(checkout_port 12432 1)}"
readonly PORT PORT_VARIABLE=MEMORIA_PG_PORT PORT_LAST=65535
readonly DB_NAME=memoria
readonly SUPERUSER=postgres
readonly READY_TIMEOUT_S=30

durable() { [[ ${MEMORIA_PG_DURABLE:-0} == 1 ]]; }

# One value from the server (superuser, over the socket) on stdout; as_server would send it
# to stderr.
server_value() {
    local sockdir="$1" port="$2" sql="$3"
    local cmd=("$BINDIR/psql" -X -q -At -h "$sockdir" -p "$port" -U "$SUPERUSER" -d postgres -c "$sql")
    if is_root; then
        (cd / && runuser -u postgres -- "${cmd[@]}") 9>&- 2>/dev/null
    else
        (cd / && "${cmd[@]}") 9>&- 2>/dev/null
    fi
}

# initdb and postgres refuse to run as root, so as root the cluster belongs to
# the Debian `postgres` system user; otherwise it belongs to whoever runs us.
server_user() {
    if is_root; then echo postgres; else id -un; fi
}

# Run a PostgreSQL client/server tool as the server user.
# - stdout goes to stderr: our stdout is reserved for the export lines.
# - fd 9 (the lock) is closed: pg_ctl's postmaster would otherwise inherit it
#   and hold the lock for as long as the server runs.
# - `cd /`: as root our cwd may not be readable by postgres, and some tools
#   complain when they cannot resolve it.
as_server() {
    if is_root; then
        (cd / && runuser -u postgres -- "$@") >&2 9>&-
    else
        (cd / && "$@") >&2 9>&-
    fi
}

# Like as_server but quiet and only for a yes/no answer.
as_server_test() {
    as_server "$@" >/dev/null 2>&1
}

export_lines() {
    printf 'export MEMORIA_TEST_PG_OWNER_URL=postgresql+psycopg://memoria_owner:memoria_owner@127.0.0.1:%s/%s\n' "$PORT" "$DB_NAME"
    printf 'export MEMORIA_TEST_PG_APP_URL=postgresql+psycopg://memoria_app:memoria_app@127.0.0.1:%s/%s\n' "$PORT" "$DB_NAME"
}


# Highest-versioned Debian server install. `pg_config --bindir` is not used:
# it comes from libpq-dev / postgresql-common and may point at a client-only
# version or not exist at all.
find_bindir() {
    local candidates=() f
    for f in /usr/lib/postgresql/*/bin/initdb; do
        [[ -x $f ]] && candidates+=("$(dirname -- "$f")")
    done
    ((${#candidates[@]})) || return 1
    printf '%s\n' "${candidates[@]}" | sort -V | tail -n 1
}

# Binaries for an existing cluster must match its major version (a newer
# server cannot open an older data directory), so prefer those.
bindir_for_data() {
    local version
    if [[ -f $DATA/PG_VERSION ]]; then
        version="$(<"$DATA/PG_VERSION")"
        if [[ -x /usr/lib/postgresql/$version/bin/pg_ctl ]]; then
            echo "/usr/lib/postgresql/$version/bin"
            return 0
        fi
        return 1
    fi
    find_bindir
}

ensure_binaries() {
    if BINDIR="$(find_bindir)"; then return 0; fi
    if is_root; then
        log "no PostgreSQL server found under /usr/lib/postgresql; installing the 'postgresql' package"
        apt-get update -qq >&2
        DEBIAN_FRONTEND=noninteractive apt-get install -y -qq postgresql >&2
        if BINDIR="$(find_bindir)"; then return 0; fi
    fi
    die "no PostgreSQL server binaries (/usr/lib/postgresql/*/bin/initdb); install them with: sudo apt-get install postgresql"
}

# Can the server user reach (traverse) DIR, or, if DIR does not exist yet, its
# nearest existing ancestor? Only a question when we are root: otherwise the
# server user is us, and mkdir tells us soon enough.
server_can_reach() {
    local dir="$1"
    is_root || return 0
    while [[ ! -e $dir ]]; do dir="$(dirname -- "$dir")"; done
    as_server_test test -x "$dir"
}

# Decide BASE/DATA/RUN/LOG. Every command computes the same answer, so `stop`
# and `status` find what `start` created. BASE is left empty when there can be
# no cluster at all (root, but PostgreSQL was never installed).
resolve_layout() {
    BASE="$(realpath -m -- "${MEMORIA_PG_DIR:-$REPO_ROOT/.pg}")"
    BASE_IN_TMP=0
    if is_root && ! getent passwd postgres >/dev/null; then
        BASE=""
        return 0
    fi
    if ! server_can_reach "$BASE"; then
        # The server user cannot get through some parent of BASE. We do not
        # loosen permissions on directories that are not ours; a dir under
        # /tmp (named by port, so every command finds it) avoids that.
        local fallback="/tmp/memoria-pg-$PORT"
        [[ ${1:-} != start ]] ||
            log "user postgres cannot reach $BASE; using $fallback instead"
        BASE="$fallback"
        BASE_IN_TMP=1
    fi
    DATA="$BASE/data"
    RUN="$BASE/run"
    LOG="$BASE/server.log"
}

# Create DIR (MODE, owned by OWNER) unless it exists, then insist that it is a
# real directory owned by OWNER: in world-writable /tmp nobody may plant one
# for us, and a cluster made by another user cannot be started by this one.
make_dir() {
    local dir="$1" mode="$2" owner="$3" actual
    # mkdir may lose a race against a concurrent `start` (before the lock is
    # taken); that is fine as long as the checks below pass.
    if [[ ! -e $dir && ! -L $dir ]] && mkdir -m "$mode" -- "$dir" 2>/dev/null; then
        [[ $owner == "$(id -un)" ]] || chown -- "$owner:" "$dir"
    fi
    [[ -d $dir && ! -L $dir ]] || die "cannot create directory $dir (or it is not a plain directory)"
    actual="$(stat -c %U -- "$dir")"
    [[ $actual == "$owner" ]] ||
        die "$dir is owned by '$actual', not '$owner'; remove it (it is throwaway) and retry"
}

# Socket path = RUN/.s.PGSQL.PORT; unix socket paths are limited to 107 bytes
# and postgres refuses longer ones. Keep well below; otherwise use /tmp.
prepare_socket_dir() {
    local sock="$RUN/.s.PGSQL.$PORT"
    if ((${#sock} >= 100)); then
        local fallback
        fallback="/tmp/memoria-pg-$(id -u "$(server_user)")-$PORT"
        log "socket path under $RUN would be too long (${#sock} chars); using $fallback"
        RUN="$fallback"
    fi
    # 0700: local socket connections are trusted, so only the server user
    # (and root) may reach the socket.
    make_dir "$RUN" 0700 "$(server_user)"
}

pg_running() {
    [[ -n ${BASE:-} && -f $DATA/PG_VERSION ]] || return 1
    local bindir
    bindir="$(bindir_for_data)" || return 1
    as_server_test "$bindir/pg_ctl" status -D "$DATA"
}

# postmaster.pid records the running server's port (line 4) and first socket
# directory (line 5): use those, not our guesses, when it is already up.
running_port() { sed -n 4p "$DATA/postmaster.pid"; }
running_socket_dir() { sed -n 5p "$DATA/postmaster.pid"; }


init_cluster() {
    log "initialising a new cluster in $DATA"
    make_dir "$DATA" 0700 "$(server_user)"
    # initdb reads the superuser password from a file that the server user can
    # read; keep a copy for the caller and delete the temporary one.
    local pw pwtmp
    pw="$(od -An -N24 -tx1 /dev/urandom | tr -d ' \n')"
    (umask 077 && printf '%s\n' "$pw" >"$BASE/superuser.password")
    pwtmp="$RUN/initdb.pw"
    (umask 077 && printf '%s\n' "$pw" >"$pwtmp")
    if is_root; then chown -- postgres: "$pwtmp"; fi
    # Socket connections are trusted (the socket dir is private to the server
    # user); TCP needs a password, which is what the tests use. C.UTF-8 gives
    # deterministic sorting on every Debian host without installing locales.
    # --no-sync: nothing here needs to survive a power cut.
    if ! as_server "$BINDIR/initdb" -D "$DATA" -U "$SUPERUSER" --pwfile="$pwtmp" \
        --auth-local=trust --auth-host=scram-sha-256 \
        --encoding=UTF8 --locale=C.UTF-8 --no-sync; then
        rm -f -- "$pwtmp"
        die "initdb failed"
    fi
    rm -f -- "$pwtmp"
}

start_server() {
    # A shell command line, parsed by /bin/sh inside pg_ctl: quote the path.
    local sockdir_q
    sockdir_q="$(printf '%q' "$RUN")"
    # Durability is pointless for a throwaway test server; these settings make
    # test setup and teardown several times faster. MEMORIA_PG_DURABLE=1 keeps
    # PostgreSQL's defaults (all on), for figures a user may compare.
    local opts="-p $PORT -k $sockdir_q -c listen_addresses=127.0.0.1"
    if ! durable; then
        opts+=" -c fsync=off -c synchronous_commit=off -c full_page_writes=off"
    fi
    opts+=" -c max_connections=200 -c shared_buffers=128MB"
    [[ -e $LOG ]] || : >"$LOG"
    if is_root; then chown -- postgres: "$LOG"; fi
    log "starting PostgreSQL ($BINDIR) on 127.0.0.1:$PORT, log in $LOG"
    # -w -t: pg_ctl waits (bounded) until the server accepts connections or has
    # died. (With -W, `pg_ctl status` right after the start could run before
    # postmaster.pid existed and report a live server as stopped.)
    as_server "$BINDIR/pg_ctl" start -w -t "$READY_TIMEOUT_S" -D "$DATA" -l "$LOG" -o "$opts" ||
        fail_with_log "pg_ctl start failed"
}


wait_ready() {
    local sockdir="$1" port="$2" deadline=$((SECONDS + READY_TIMEOUT_S))
    until as_server_test "$BINDIR/pg_isready" -q -h "$sockdir" -p "$port" -d postgres -U "$SUPERUSER"; do
        # If the postmaster has already exited there is nothing to wait for.
        as_server_test "$BINDIR/pg_ctl" status -D "$DATA" ||
            fail_with_log "the server stopped before it was ready"
        ((SECONDS < deadline)) ||
            fail_with_log "the server was not ready after ${READY_TIMEOUT_S}s"
        sleep 0.2
    done
}

# Idempotent: re-running it repairs drift (passwords, attributes, owners).
ensure_roles() {
    local sockdir="$1" port="$2"
    as_server "$BINDIR/psql" -X -q -v ON_ERROR_STOP=1 -h "$sockdir" -p "$port" \
        -U "$SUPERUSER" -d postgres <<'SQL'
SET client_min_messages = warning;
DO $$
BEGIN
    IF NOT EXISTS (SELECT FROM pg_roles WHERE rolname = 'memoria_owner') THEN
        CREATE ROLE memoria_owner;
    END IF;
    IF NOT EXISTS (SELECT FROM pg_roles WHERE rolname = 'memoria_app') THEN
        CREATE ROLE memoria_app;
    END IF;
END
$$;
-- Runs migrations; CREATEDB so tests can make per-run databases.
ALTER ROLE memoria_owner WITH LOGIN PASSWORD 'memoria_owner' NOSUPERUSER CREATEDB;
-- Tests drop their per-run databases WITH (FORCE), which ends the service role's
-- lingering connections: that needs pg_signal_backend.
GRANT pg_signal_backend TO memoria_owner;
-- The service role: row-level security must apply to it.
ALTER ROLE memoria_app WITH LOGIN PASSWORD 'memoria_app'
    NOSUPERUSER NOBYPASSRLS NOCREATEDB NOCREATEROLE;
-- Memoria sets it on each connection; behind a transaction pooler (scripts/pgbouncer.sh) it
-- cannot, and the role's own setting is what holds (STATEMENT_TIMEOUT_MS, 15 s).
ALTER ROLE memoria_app SET statement_timeout = '15s';
SELECT 'CREATE DATABASE memoria OWNER memoria_owner'
WHERE NOT EXISTS (SELECT FROM pg_database WHERE datname = 'memoria') \gexec
ALTER DATABASE memoria OWNER TO memoria_owner;
GRANT CONNECT ON DATABASE memoria TO memoria_app;
\connect memoria
ALTER SCHEMA public OWNER TO memoria_owner;
-- Already the default from PostgreSQL 15; older servers let everyone create
-- objects in public. Table grants are the migrations' business.
REVOKE CREATE ON SCHEMA public FROM PUBLIC;
SQL
}

cmd_start() {
    check_port
    ensure_binaries
    ! is_root || getent passwd postgres >/dev/null ||
        die "PostgreSQL is installed but there is no 'postgres' user to run it as"
    resolve_layout start
    if ((BASE_IN_TMP)); then
        make_dir "$BASE" 0755 "$(id -un)"
    else
        # Inside the repo (or wherever MEMORIA_PG_DIR points): an ordinary
        # directory of the caller's, which may be a symlink.
        mkdir -p -- "$BASE"
    fi
    lock

    # A cluster left by another user (say, a run without root) cannot be
    # started by this one; make_dir says so plainly instead of pg_ctl.
    if [[ -e $DATA ]]; then make_dir "$DATA" 0700 "$(server_user)"; fi
    if [[ -f $DATA/PG_VERSION ]]; then
        BINDIR="$(bindir_for_data)" ||
            die "$DATA was made by PostgreSQL $(<"$DATA/PG_VERSION"), which is not installed; delete $BASE and retry"
    fi

    local sockdir port
    if pg_running; then
        port="$(running_port)"
        sockdir="$(running_socket_dir)"
        [[ $port == "$PORT" ]] ||
            die "the server in $DATA is running on port $port, not $PORT; run '$0 stop' first"
        log "already running on 127.0.0.1:$PORT"
    else
        prepare_socket_dir
        [[ -f $DATA/PG_VERSION ]] || init_cluster
        start_server
        port="$PORT"
        sockdir="$RUN"
    fi
    wait_ready "$sockdir" "$port"
    local fsync want=off
    ! durable || want=on
    fsync="$(server_value "$sockdir" "$port" "SHOW fsync")"
    [[ $fsync == "$want" ]] ||
        die "the server in $DATA runs with fsync=$fsync, but MEMORIA_PG_DURABLE=${MEMORIA_PG_DURABLE:-0} asks for fsync=$want; run '$0 stop' first"
    log "durability: fsync=$fsync"
    ensure_roles "$sockdir" "$port"
    log "ready"
    export_lines
}

cmd_stop() {
    check_port
    resolve_layout stop
    if ! pg_running; then
        log "not running"
        return 0
    fi
    lock
    # Another `stop` may have won the race for the lock.
    if ! pg_running; then
        log "not running"
        return 0
    fi
    log "stopping the server in $DATA"
    as_server "$(bindir_for_data)/pg_ctl" stop -D "$DATA" -m fast -w
}

cmd_status() {
    check_port
    resolve_layout status
    if pg_running; then
        log "running on 127.0.0.1:$(running_port) (data: $DATA)"
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
