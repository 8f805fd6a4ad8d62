"""The throwaway PostgreSQL of scripts/pg.sh, as the tests and the benchmarks find it."""

from __future__ import annotations

import os
import socket
import subprocess
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def run_script(
    script: str, *args: str, env: dict[str, str] | None = None, timeout: float = 600
) -> str:
    """Run scripts/<script> with `args` (in `env`, else this process's environment); its stdout.
    In a session of its own: a Ctrl-C of the caller does not reach the servers it starts."""
    out = subprocess.run(
        ["bash", str(ROOT / "scripts" / script), *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
        start_new_session=True,
    )
    if out.returncode != 0:
        raise RuntimeError(f"scripts/{script} {' '.join(args)} failed:\n{out.stderr[-2000:]}")
    return out.stdout


def exports(stdout: str) -> dict[str, str]:
    """The `export NAME=value` lines a script printed, as a mapping."""
    return dict(
        line.removeprefix("export ").split("=", 1)
        for line in stdout.splitlines()
        if line.startswith("export ")
    )


def pg_urls() -> tuple[str, str]:
    """(owner URL, service-role URL): from MEMORIA_TEST_PG_OWNER_URL / _APP_URL when both are
    set, else from `scripts/pg.sh start` (which starts the server if it is not running)."""
    owner = os.environ.get("MEMORIA_TEST_PG_OWNER_URL")
    app = os.environ.get("MEMORIA_TEST_PG_APP_URL")
    if owner and app:
        return owner, app
    urls = exports(run_script("pg.sh", "start"))
    return urls["MEMORIA_TEST_PG_OWNER_URL"], urls["MEMORIA_TEST_PG_APP_URL"]


def pgbouncer_url() -> str:
    """The service role's URL through the test PgBouncer (transaction pooling, in front of the
    PostgreSQL of `pg_urls`): MEMORIA_TEST_PGBOUNCER_URL when set, else from
    `scripts/pgbouncer.sh start` (which starts both if they are not running)."""
    url = os.environ.get("MEMORIA_TEST_PGBOUNCER_URL")
    if url:
        return url
    stdout = run_script("pgbouncer.sh", "start")
    url = exports(stdout).get("MEMORIA_TEST_PGBOUNCER_URL")
    if url is None:
        raise RuntimeError(f"scripts/pgbouncer.sh printed no URL:\n{stdout}")
    return url


def citus_urls() -> tuple[str, str]:
    """(owner URL, service-role URL) of the test Citus cluster's coordinator: from
    MEMORIA_TEST_CITUS_OWNER_URL / _APP_URL when both are set, else from `scripts/citus.sh
    start` (which starts a coordinator and two workers if they are not running)."""
    owner = os.environ.get("MEMORIA_TEST_CITUS_OWNER_URL")
    app = os.environ.get("MEMORIA_TEST_CITUS_APP_URL")
    if owner and app:
        return owner, app
    urls = exports(run_script("citus.sh", "start"))
    return urls["MEMORIA_TEST_CITUS_OWNER_URL"], urls["MEMORIA_TEST_CITUS_APP_URL"]


def citus_database(name: str, *, drop: bool = False) -> None:
    """Make (or drop) a database `name` on every node of the test Citus cluster: Citus keeps
    its catalogue per database, so a database is set up on each node (scripts/citus.sh)."""
    run_script("citus.sh", "dropdb" if drop else "createdb", name)


@dataclass
class OwnPostgres:
    """A throwaway PostgreSQL cluster of one test: scripts/pg.sh on a directory and port of
    its own, so stopping it touches no other test's database."""

    directory: Path
    port: int
    owner_url: str = ""
    app_url: str = ""
    durable: bool = False
    """PostgreSQL's own durability settings (MEMORIA_PG_DURABLE=1: fsync and
    synchronous_commit on), for a cluster whose commits are meant to survive."""

    def pg(self, command: str) -> str:
        env = {k: v for k, v in os.environ.items() if not k.startswith(("PG", "MEMORIA_"))}
        env |= {"MEMORIA_PG_DIR": str(self.directory), "MEMORIA_PG_PORT": str(self.port)}
        if self.durable:
            env["MEMORIA_PG_DURABLE"] = "1"
        return run_script("pg.sh", command, env=env, timeout=120)

    def start(self) -> None:
        urls = exports(self.pg("start"))
        self.owner_url = urls["MEMORIA_TEST_PG_OWNER_URL"]
        self.app_url = urls["MEMORIA_TEST_PG_APP_URL"]

    def stop(self) -> None:
        self.pg("stop")


def free_port() -> int:
    """A loopback TCP port nothing listens on at the moment."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port
