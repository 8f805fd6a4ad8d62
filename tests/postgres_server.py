"""The throwaway PostgreSQL of scripts/pg.sh, as the tests and the benchmarks find it."""

from __future__ import annotations

import os
import socket
import subprocess
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def pg_urls() -> tuple[str, str]:
    """(owner URL, service-role URL): from MEMORIA_TEST_PG_OWNER_URL / _APP_URL when both are
    set, else from `scripts/pg.sh start` (which starts the server if it is not running)."""
    owner = os.environ.get("MEMORIA_TEST_PG_OWNER_URL")
    app = os.environ.get("MEMORIA_TEST_PG_APP_URL")
    if owner and app:
        return owner, app
    out = subprocess.run(
        ["bash", str(ROOT / "scripts" / "pg.sh"), "start"],
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
        start_new_session=True,  # a Ctrl-C of the caller does not reach the server
    )
    if out.returncode != 0:
        raise RuntimeError(f"scripts/pg.sh start failed:\n{out.stderr[-2000:]}")
    urls = dict(
        line.removeprefix("export ").split("=", 1)
        for line in out.stdout.splitlines()
        if line.startswith("export ")
    )
    return urls["MEMORIA_TEST_PG_OWNER_URL"], urls["MEMORIA_TEST_PG_APP_URL"]


def pgbouncer_url() -> str:
    """The service role's URL through the test PgBouncer (transaction pooling, in front of the
    PostgreSQL of `pg_urls`): MEMORIA_TEST_PGBOUNCER_URL when set, else from
    `scripts/pgbouncer.sh start` (which starts both if they are not running)."""
    url = os.environ.get("MEMORIA_TEST_PGBOUNCER_URL")
    if url:
        return url
    out = subprocess.run(
        ["bash", str(ROOT / "scripts" / "pgbouncer.sh"), "start"],
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
        start_new_session=True,
    )
    if out.returncode != 0:
        raise RuntimeError(f"scripts/pgbouncer.sh start failed:\n{out.stderr[-2000:]}")
    for line in out.stdout.splitlines():
        if line.startswith("export MEMORIA_TEST_PGBOUNCER_URL="):
            return line.split("=", 1)[1]
    raise RuntimeError(f"scripts/pgbouncer.sh printed no URL:\n{out.stdout}")


def _citus(*args: str) -> str:
    """Run scripts/citus.sh with `args`; its stdout."""
    out = subprocess.run(
        ["bash", str(ROOT / "scripts" / "citus.sh"), *args],
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
        start_new_session=True,  # a Ctrl-C of the caller does not reach the cluster
    )
    if out.returncode != 0:
        raise RuntimeError(f"scripts/citus.sh {' '.join(args)} failed:\n{out.stderr[-2000:]}")
    return out.stdout


def citus_urls() -> tuple[str, str]:
    """(owner URL, service-role URL) of the test Citus cluster's coordinator: from
    MEMORIA_TEST_CITUS_OWNER_URL / _APP_URL when both are set, else from `scripts/citus.sh
    start` (which starts a coordinator and two workers if they are not running)."""
    owner = os.environ.get("MEMORIA_TEST_CITUS_OWNER_URL")
    app = os.environ.get("MEMORIA_TEST_CITUS_APP_URL")
    if owner and app:
        return owner, app
    urls = dict(
        line.removeprefix("export ").split("=", 1)
        for line in _citus("start").splitlines()
        if line.startswith("export ")
    )
    return urls["MEMORIA_TEST_CITUS_OWNER_URL"], urls["MEMORIA_TEST_CITUS_APP_URL"]


def citus_database(name: str, *, drop: bool = False) -> None:
    """Make (or drop) a database `name` on every node of the test Citus cluster: Citus keeps
    its catalogue per database, so a database is set up on each node (scripts/citus.sh)."""
    _citus("dropdb" if drop else "createdb", name)


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
        done = subprocess.run(
            ["bash", str(ROOT / "scripts" / "pg.sh"), command],
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
            start_new_session=True,  # a Ctrl-C of pytest does not reach the cluster
        )
        if done.returncode != 0:
            raise RuntimeError(f"pg.sh {command} failed:\n{done.stderr[-2000:]}")
        return done.stdout

    def start(self) -> None:
        urls = dict(
            line.removeprefix("export ").split("=", 1)
            for line in self.pg("start").splitlines()
            if line.startswith("export ")
        )
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
