#!/usr/bin/env bash
# The whole test suite: static checks; the TypeScript and Go clients, buf curl and ghz against
# one running server (scripts/test-clients.sh); then pytest against SQLite and a real PostgreSQL.
# PostgreSQL is started by scripts/pg.sh (installed with apt-get when missing and root).
# MEMORIA_REQUIRE_POSTGRES=1 makes a missing PostgreSQL a failure, never a skip.
# PgBouncer (scripts/pgbouncer.sh, Debian's, installed the same way) runs in transaction pooling
# mode in front of it for the pooler cases; MEMORIA_REQUIRE_PGBOUNCER=1 makes a missing one fail.
# Citus (scripts/citus.sh: a coordinator and two workers on loopback, ../shared/citus installed
# into PostgreSQL 15.20+) runs the Citus cases; MEMORIA_REQUIRE_CITUS=1 makes a missing one fail.
# The Qdrant server tests start ../shared/qdrant/qdrant (or MEMORIA_TEST_QDRANT_BIN, or use
# the server of MEMORIA_TEST_QDRANT_URL); MEMORIA_REQUIRE_QDRANT=1 makes a missing one a failure.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"

scripts/lint.sh

echo "== clients against a running server" >&2
scripts/test-clients.sh

echo "== PostgreSQL" >&2
# Two steps, so that a failing start stops the run (eval "$(...)" would hide its status).
pg_env=$(scripts/pg.sh start)
eval "$pg_env"
# Said last, whatever pytest's outcome: the server stays up so the next run starts at once.
trap 'echo "== PostgreSQL (scripts/pg.sh), PgBouncer (scripts/pgbouncer.sh) and Citus (scripts/citus.sh) are left running for the next run; stop them with: make pg-stop" >&2' EXIT
export MEMORIA_TEST_PG_OWNER_URL MEMORIA_TEST_PG_APP_URL
export MEMORIA_REQUIRE_POSTGRES=1

echo "== PgBouncer in front of it" >&2
# Where it cannot be had, the pooler cases fail saying so (the run goes on).
if pgbouncer_env=$(scripts/pgbouncer.sh start); then
  eval "$pgbouncer_env"
  export MEMORIA_TEST_PGBOUNCER_URL
fi
export MEMORIA_REQUIRE_PGBOUNCER=1

echo "== Citus: a coordinator and two workers" >&2
# Where it cannot be had, the Citus cases fail saying so (the run goes on).
if citus_env=$(scripts/citus.sh start); then
  eval "$citus_env"
  export MEMORIA_TEST_CITUS_OWNER_URL MEMORIA_TEST_CITUS_APP_URL
fi
export MEMORIA_REQUIRE_CITUS=1
export MEMORIA_REQUIRE_QDRANT=1

echo "== Chromium for the browser tests" >&2
# The settings page's tests (tests/browser/) drive Debian's chromium; where it cannot be
# installed they fail saying so (the run goes on, so every other test still reports).
if chromium=$(scripts/chromium.sh); then
  export MEMORIA_TEST_CHROMIUM=$chromium
fi

echo "== pytest" >&2
.venv/bin/pytest "$@"
