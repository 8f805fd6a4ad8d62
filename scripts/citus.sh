#!/usr/bin/env bash
# Manage a throwaway Citus cluster (a coordinator and two workers on loopback) for the tests and
# benchmarks that run Memoria sharded by tenant (issue 22, DESIGN 4).
#
#   scripts/citus.sh start    start (initialising on first use), ensure roles, print exports
#   scripts/citus.sh stop     stop the three nodes (fast mode); success if none was running
#   scripts/citus.sh env      print the export lines only, start nothing
#   scripts/citus.sh status   exit 0 if all three nodes run, 1 if not
#   scripts/citus.sh createdb NAME / dropdb NAME
#                             a database of that name on every node, set up as `memoria` is
#                             (the tests' per-session database) / dropped from every node;
#                             MEMORIA_CITUS_WORKERS=1 registers only the first worker in it
#                             (bench/bench_citus.py: one worker against two)
#
# Typical use:  eval "$(scripts/citus.sh start)"
#
# Citus is not in Debian's packages: ../shared/citus holds Citus 13.2 built for Debian's
# PostgreSQL 15, and its install.sh copies it into the server's directories. `start` runs it
# when `pg_config --pkglibdir`/citus.so is missing (as root, like pg.sh's apt-get install).
#
# The nodes are three PostgreSQL 15 clusters with shared_preload_libraries = 'citus', run by
# the server user (postgres when we are root) with pg.sh's test settings (fsync,
# synchronous_commit and full_page_writes off: nothing here must survive a power cut). Every
# node has the citus extension in `memoria` (and in postgres, for the node registration); the
# coordinator knows the workers. The roles are pg.sh's: memoria_owner (runs the migrations)
# and memoria_app (the service: not a superuser, no BYPASSRLS, so row-level security applies).
# TCP logins need a password (SCRAM) on every node; the coordinator's own connections to the
# workers find the passwords in pg_dist_authinfo, Citus's catalogue for them.
#
# `citus.propagate_set_commands = 'local'` is set on the memoria database: Citus forwards a
# transaction's `SET LOCAL app.tenant_id` to the workers only with it, and Memoria refuses to
# start on a Citus database without it (server/runtime/builders/stores.py).
#
# stdout carries only the two `export ...` lines (the coordinator's owner and service URLs);
# progress and errors go to stderr.
#
# Layout, under MEMORIA_CITUS_DIR (default: <repo root>/.citus, or /tmp/memoria-citus-<port>
# when the server user cannot reach it): c/, w1/, w2/ (the clusters),
# run/ (their unix sockets, private to the server user), <node>.log, superuser.password, .lock.
#
# Ports: MEMORIA_CITUS_PORT for the coordinator, the workers on the next two; by default 20400
# plus three times a number derived from the checkout's path (0-999), so two checkouts each get
# their own cluster. Below 32768 on purpose: the kernel hands out 32768-60999 for outgoing
# connections, and one of those may hold a port when a node binds it.
set -euo pipefail
umask 022
unset PGHOST PGHOSTADDR PGPORT PGUSER PGDATABASE PGPASSWORD PGPASSFILE \
    PGSERVICE PGSERVICEFILE PGOPTIONS PGDATA PGSSLMODE PGTARGETSESSIONATTRS

SCRIPT_DIR="$(cd -- "$(dirname -- "${BASH_SOURCE[0]}")" && pwd -P)"
REPO_ROOT="$(dirname -- "$SCRIPT_DIR")"
readonly SCRIPT_DIR REPO_ROOT
# shellcheck source=scripts/lib.sh
. "$SCRIPT_DIR/lib.sh"
PORT="${MEMORIA_CITUS_PORT:-$(checkout_port 20400 3)}"
readonly PORT PORT_VARIABLE=MEMORIA_CITUS_PORT PORT_LAST=65533 # a port per node
readonly NODES=(c w1 w2)
readonly DB_NAME=memoria
WORKERS="${MEMORIA_CITUS_WORKERS:-2}"
[[ $WORKERS == 1 || $WORKERS == 2 ]] || { echo "citus.sh: MEMORIA_CITUS_WORKERS must be 1 or 2" >&2; exit 1; }
readonly WORKERS
readonly SUPERUSER=postgres
readonly READY_TIMEOUT_S=30
readonly SYSTEM_BINDIR=/usr/lib/postgresql/15/bin
readonly CITUS_BUILD="$REPO_ROOT/../shared/citus"
# As root the nodes run as postgres, which must reach the directory; when it cannot (a checkout
# under a private home), a directory under /tmp named by the port, as scripts/pg.sh does.
base_dir() {
    local dir probe
    dir="$(realpath -m -- "${MEMORIA_CITUS_DIR:-$REPO_ROOT/.citus}")"
    if [[ $(id -u) -eq 0 ]] && getent passwd postgres >/dev/null; then
        probe="$dir"
        while [[ ! -e $probe ]]; do probe="$(dirname -- "$probe")"; done
        (cd / && runuser -u postgres -- test -x "$probe") 2>/dev/null || dir="/tmp/memoria-citus-$PORT"
    fi
    echo "$dir"
}
BASE="$(base_dir)"
readonly BASE


server_user() { if is_root; then echo postgres; else id -un; fi; }

# As the server user, from / (our cwd may be unreadable to it), stdout to stderr, without the
# lock's fd 9 (a postmaster would otherwise hold the lock for as long as it runs).
as_server() {
    if is_root; then
        (cd / && runuser -u postgres -- "$@") >&2 9>&-
    else
        (cd / && "$@") >&2 9>&-
    fi
}

node_port() {
    local i
    for i in "${!NODES[@]}"; do
        [[ ${NODES[$i]} == "$1" ]] && echo $((PORT + i)) && return 0
    done
    return 1
}

# psql as the superuser over the node's socket; ON_ERROR_STOP; SQL on stdin.
node_psql() {
    local node="$1" db="$2"
    shift 2
    as_server "$PSQL" -X -q -v ON_ERROR_STOP=1 -h "$BASE/run" -p "$(node_port "$node")" \
        -U "$SUPERUSER" -d "$db" "$@"
}

# One value from a node (superuser, over the socket) on stdout.
node_value() {
    local node="$1" db="$2" sql="$3" cmd
    cmd=("$PSQL" -X -q -At -h "$BASE/run" -p "$(node_port "$node")" -U "$SUPERUSER" -d "$db" -c "$sql")
    if is_root; then
        (cd / && runuser -u postgres -- "${cmd[@]}") 9>&- 2>/dev/null
    else
        (cd / && "${cmd[@]}") 9>&- 2>/dev/null
    fi
}

export_lines() {
    printf 'export MEMORIA_TEST_CITUS_OWNER_URL=postgresql+psycopg://memoria_owner:memoria_owner@127.0.0.1:%s/%s\n' "$PORT" "$DB_NAME"
    printf 'export MEMORIA_TEST_CITUS_APP_URL=postgresql+psycopg://memoria_app:memoria_app@127.0.0.1:%s/%s\n' "$PORT" "$DB_NAME"
}


# The minor version of the PostgreSQL 15 server in a bin directory (15.20 -> 20).
minor_version() { "$1/postgres" --version | sed -E 's/.* 15\.([0-9]+).*/\1/'; }

# The build in ../shared/citus needs PostgreSQL 15.20 or later: it was built against 15.20's
# headers and calls heap_datum_check(), which earlier 15.x servers do not export (measured:
# 15.18 refuses to load it, "undefined symbol: heap_datum_check"). So BINDIR is the system's
# PostgreSQL 15 when it is recent enough, with Citus installed into it by install.sh; else a
# private copy of Debian's current postgresql-15 package under $BASE/pg (`apt-get download`,
# unpacked, never installed: the machine's own server, which pg.sh and the benchmarks use, is
# left as it is), with Citus installed into that copy. psql is the system's.
ensure_citus() {
    [[ -x $SYSTEM_BINDIR/postgres ]] ||
        die "no PostgreSQL 15 server ($SYSTEM_BINDIR/postgres); install it with: sudo apt-get install postgresql-15"
    PSQL="$SYSTEM_BINDIR/psql"
    if (($(minor_version "$SYSTEM_BINDIR") >= 20)); then
        BINDIR="$SYSTEM_BINDIR"
        [[ -f $BINDIR/../lib/citus.so ]] && return 0
        is_root || die "Citus is not installed in PostgreSQL 15; run (as root) $CITUS_BUILD/install.sh"
        install_citus "$BINDIR/pg_config"
        return 0
    fi
    local tree="$BASE/pg" version
    BINDIR="$tree/usr/lib/postgresql/15/bin"
    if [[ -f $tree/usr/lib/postgresql/15/lib/citus.so ]]; then return 0; fi
    version="$("$SYSTEM_BINDIR/postgres" --version | cut -d' ' -f3)"
    command -v apt-get >/dev/null ||
        die "PostgreSQL $version is too old for this Citus build (needs 15.20+) and there is no apt-get"
    log "PostgreSQL $version cannot load this Citus build (needs 15.20+); unpacking Debian's current postgresql-15 into $tree"
    rm -rf -- "$tree"
    mkdir -p -- "$tree/deb"
    (cd "$tree/deb" && apt-get download -q postgresql-15 >&2 2>/dev/null) ||
        { apt-get update -qq >&2 && (cd "$tree/deb" && apt-get download -q postgresql-15 >&2); } ||
        die "apt-get download postgresql-15 failed"
    dpkg-deb -x "$tree"/deb/postgresql-15_*.deb "$tree" || die "cannot unpack postgresql-15"
    rm -rf -- "$tree/deb"
    (($(minor_version "$BINDIR") >= 20)) ||
        die "Debian's postgresql-15 is older than 15.20; this Citus build cannot load into it"
    # install.sh asks pg_config where to put the files; that is in postgresql-server-dev, so a
    # pg_config of the unpacked tree's own answers its three questions.
    cat >"$BINDIR/pg_config" <<EOF
#!/bin/sh
for a; do case \$a in
--version) "$BINDIR/postgres" --version | sed 's/.*(PostgreSQL) /PostgreSQL /' ;;
--pkglibdir) echo "$tree/usr/lib/postgresql/15/lib" ;;
--sharedir) echo "$tree/usr/share/postgresql/15" ;;
esac; done
EOF
    chmod 0755 "$BINDIR/pg_config"
    install_citus "$BINDIR/pg_config"
}

install_citus() {
    [[ -x $CITUS_BUILD/install.sh ]] || die "Citus is not installed and there is no $CITUS_BUILD/install.sh"
    log "installing Citus from $CITUS_BUILD"
    PG_CONFIG="$1" "$CITUS_BUILD/install.sh" >&2 || die "$CITUS_BUILD/install.sh failed"
}

running() { as_server "$BINDIR/pg_ctl" status -D "$BASE/$1" >/dev/null 2>&1; }

make_dir() {
    local dir="$1" mode="$2" owner="$3"
    if [[ ! -e $dir ]]; then
        mkdir -m "$mode" -- "$dir"
        [[ $owner == "$(id -un)" ]] || chown -- "$owner:" "$dir"
    fi
    [[ -d $dir && ! -L $dir && $(stat -c %U -- "$dir") == "$owner" ]] ||
        die "$dir is not a directory owned by '$owner'; remove $BASE (it is throwaway) and retry"
}

init_node() {
    local node="$1" pwfile="$BASE/run/initdb.pw"
    log "initialising node $node in $BASE/$node"
    make_dir "$BASE/$node" 0700 "$(server_user)"
    (umask 077 && cp -- "$BASE/superuser.password" "$pwfile")
    if is_root; then chown -- postgres: "$pwfile"; fi
    as_server "$BINDIR/initdb" -D "$BASE/$node" -U "$SUPERUSER" --pwfile="$pwfile" \
        --auth-local=trust --auth-host=scram-sha-256 --encoding=UTF8 --locale=C.UTF-8 \
        --no-sync || {
        rm -f -- "$pwfile"
        die "initdb failed for node $node"
    }
    rm -f -- "$pwfile"
    echo "shared_preload_libraries = 'citus'" >>"$BASE/$node/postgresql.conf"
}

start_node() {
    local node="$1" port log_file="$BASE/$1.log"
    port="$(node_port "$node")"
    [[ -e $log_file ]] || : >"$log_file"
    if is_root; then chown -- postgres: "$log_file"; fi
    # The same test settings as scripts/pg.sh: durability is pointless for a throwaway cluster.
    local opts="-p $port -k $(printf '%q' "$BASE/run") -c listen_addresses=127.0.0.1"
    opts+=" -c fsync=off -c synchronous_commit=off -c full_page_writes=off"
    opts+=" -c max_connections=300 -c shared_buffers=64MB"
    log "starting node $node on 127.0.0.1:$port, log in $log_file"
    as_server "$BINDIR/pg_ctl" start -w -t "$READY_TIMEOUT_S" -D "$BASE/$node" -l "$log_file" \
        -o "$opts" || {
        tail -n 20 -- "$log_file" >&2 || true
        die "node $node did not start"
    }
}

# The roles on one node; idempotent.
ensure_roles() {
    node_psql "$1" postgres <<'SQL'
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
ALTER ROLE memoria_owner WITH LOGIN PASSWORD 'memoria_owner' NOSUPERUSER CREATEDB;
GRANT pg_signal_backend TO memoria_owner;
ALTER ROLE memoria_app WITH LOGIN PASSWORD 'memoria_app'
    NOSUPERUSER NOBYPASSRLS NOCREATEDB NOCREATEROLE;
ALTER ROLE memoria_app SET statement_timeout = '15s';
SQL
}

# The database DB on one node, owned by memoria_owner, with the citus extension; idempotent.
# Citus keeps its catalogue per database, so each database is made on every node.
ensure_database() {
    local node="$1" db="$2"
    node_psql "$node" postgres -v db="$db" <<'SQL'
SET client_min_messages = warning;
SELECT format('CREATE DATABASE %I OWNER memoria_owner', :'db')
WHERE NOT EXISTS (SELECT FROM pg_database WHERE datname = :'db') \gexec
SELECT format('ALTER DATABASE %I OWNER TO memoria_owner', :'db') \gexec
-- Citus forwards SET LOCAL (the tenant's scope) to the workers only with this setting.
SELECT format('ALTER DATABASE %I SET citus.propagate_set_commands = local', :'db') \gexec
SELECT format('GRANT CONNECT ON DATABASE %I TO memoria_app', :'db') \gexec
SQL
    # Once: after the workers are registered, a worker refuses DDL on the objects the
    # coordinator distributed (the schema among them).
    [[ $(node_value "$node" "$db" "SELECT count(*) FROM pg_extension WHERE extname = 'citus'") != 1 ]] ||
        return 0
    node_psql "$node" "$db" <<'SQL'
SET client_min_messages = warning;
CREATE EXTENSION IF NOT EXISTS citus;
ALTER SCHEMA public OWNER TO memoria_owner;
REVOKE CREATE ON SCHEMA public FROM PUBLIC;
SQL
}

# The coordinator's connections to the workers (and to itself) log in with these passwords;
# then the workers are registered. Both idempotent.
register_workers() {
    local db="$1" pw
    pw="$(<"$BASE/superuser.password")"
    node_psql c "$db" -v pw="$pw" -v workers="$WORKERS" -v wport1="$(node_port w1)" -v wport2="$(node_port w2)" \
            -v cport="$PORT" <<'SQL'
SET client_min_messages = warning;
INSERT INTO pg_dist_authinfo (nodeid, rolename, authinfo)
SELECT 0, r.name, 'password=' || r.password
  FROM (VALUES ('postgres', :'pw'), ('memoria_owner', 'memoria_owner'),
               ('memoria_app', 'memoria_app')) AS r(name, password)
 WHERE NOT EXISTS (SELECT FROM pg_dist_authinfo a WHERE a.nodeid = 0 AND a.rolename = r.name);
SELECT citus_set_coordinator_host('127.0.0.1', :cport);
SELECT citus_add_node('127.0.0.1', :wport1);
SELECT citus_add_node('127.0.0.1', :wport2) WHERE :workers > 1;
SQL
}

# A database of its own on every node, set up as `memoria` is (the tests' per-session one).
setup_database() {
    local node
    for node in "${NODES[@]}"; do ensure_database "$node" "$1"; done
    register_workers "$1"
}


cmd_start() {
    check_port
    mkdir -p -- "$BASE"
    ensure_citus
    ! is_root || getent passwd postgres >/dev/null ||
        die "PostgreSQL is installed but there is no 'postgres' user to run it as"
    mkdir -p -- "$BASE"
    is_root && ! runuser -u postgres -- test -x "$BASE" &&
        die "user postgres cannot reach $BASE; set MEMORIA_CITUS_DIR to a directory it can"
    lock
    make_dir "$BASE/run" 0700 "$(server_user)"
    local sock="$BASE/run/.s.PGSQL.$PORT"
    ((${#sock} < 100)) || die "socket path $sock is too long; set MEMORIA_CITUS_DIR to a shorter one"
    [[ -f $BASE/superuser.password ]] ||
        (umask 077 && od -An -N24 -tx1 /dev/urandom | tr -d ' \n' >"$BASE/superuser.password")
    local node fresh=0
    for node in "${NODES[@]}"; do
        if [[ ! -f $BASE/$node/PG_VERSION ]]; then
            init_node "$node"
            fresh=1
        fi
        if running "$node"; then
            [[ $(sed -n 4p "$BASE/$node/postmaster.pid") == "$(node_port "$node")" ]] ||
                die "node $node runs on another port than $(node_port "$node"); run '$0 stop' first"
        else
            start_node "$node"
        fi
    done
    for node in "${NODES[@]}"; do ensure_roles "$node"; done
    setup_database "$DB_NAME"
    ((fresh)) && log "initialised a new cluster"
    log "ready: coordinator 127.0.0.1:$PORT, workers $(node_port w1) and $(node_port w2)"
    export_lines
}

# BINDIR for a cluster that exists: the private tree when there is one.
pick_bindir() {
    PSQL="$SYSTEM_BINDIR/psql"
    BINDIR="$SYSTEM_BINDIR"
    [[ ! -x $BASE/pg/usr/lib/postgresql/15/bin/postgres ]] || BINDIR="$BASE/pg/usr/lib/postgresql/15/bin"
}

cmd_stop() {
    check_port
    pick_bindir
    [[ -d $BASE ]] || {
        log "not running"
        return 0
    }
    lock
    local node
    for node in "${NODES[@]}"; do
        if [[ -f $BASE/$node/PG_VERSION ]] && running "$node"; then
            log "stopping node $node"
            as_server "$BINDIR/pg_ctl" stop -D "$BASE/$node" -m fast -w
        fi
    done
}

cmd_status() {
    check_port
    pick_bindir
    local node
    for node in "${NODES[@]}"; do
        if ! [[ -f $BASE/$node/PG_VERSION ]] || ! running "$node"; then
            log "not running (node $node)"
            return 1
        fi
    done
    log "running: coordinator 127.0.0.1:$PORT, workers $(node_port w1) and $(node_port w2)"
}

# createdb/dropdb NAME: for a running cluster (started by `start`).
check_name() { [[ ${1:-} =~ ^[a-z_][a-z0-9_]{0,62}$ ]] || die "a database name of [a-z0-9_], got '${1:-}'"; }
cmd_createdb() {
    check_name "$1"
    cmd_status 2>/dev/null || die "the cluster is not running; run '$0 start' first"
    lock
    setup_database "$1"
}
cmd_dropdb() {
    check_name "$1"
    local node
    pick_bindir
    for node in "${NODES[@]}"; do
        node_psql "$node" postgres -v db="$1" <<<"SELECT format('DROP DATABASE IF EXISTS %I WITH (FORCE)', :'db') \gexec"
    done
}

case "${1:-}" in
    start) cmd_start ;;
    createdb) cmd_createdb "${2:-}" ;;
    dropdb) cmd_dropdb "${2:-}" ;;
    stop) cmd_stop ;;
    env)
        check_port
        export_lines
        ;;
    status) cmd_status ;;
    *)
        echo "usage: $0 {start|stop|env|status|createdb NAME|dropdb NAME}" >&2
        exit 2
        ;;
esac
