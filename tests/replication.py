"""A primary and a synchronous streaming-replication standby of Debian's PostgreSQL on loopback,
for the failover test (tests/api/test_failover.py).

The primary is `scripts/pg.sh` on a directory and port of its own (tests/postgres_server.py's
OwnPostgres, with PostgreSQL's durability settings on: synchronous_commit must not be off). The
standby is a `pg_basebackup -R` copy of it, started on a second port, and the primary then
names it in `synchronous_standby_names`: from then on a commit is acknowledged only once the
standby has flushed it (synchronous_commit=on). The standby's copy is taken before that
setting, so once promoted it does not wait for a standby of its own that does not exist.

Both ports are below 32768: the kernel hands out ports from 32768 to 60999 to outgoing
connections, and a test's many client connections could take the one a restarted server
needs. As root the clusters belong to the `postgres` user, as with scripts/pg.sh.
"""

from __future__ import annotations

import contextlib
import os
import pwd
import random
import signal
import socket
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

import psycopg

from tests.postgres_server import OwnPostgres

STANDBY_NAME = "memoria_standby"
"""The standby's cluster_name: its WAL receiver's application_name, which the primary's
synchronous_standby_names names."""

MAX_CONNECTIONS = 200
"""As scripts/pg.sh starts the primary: a hot standby needs at least the primary's value."""


def free_low_port() -> int:
    """A loopback TCP port below the kernel's ephemeral range that nothing listens on now."""
    for _ in range(200):
        port = random.randrange(20_000, 32_000)
        with socket.socket() as probe:
            try:
                probe.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    raise RuntimeError("no free port between 20000 and 32000")


def _as_server(*command: str, timeout: float = 120) -> str:
    """Run a PostgreSQL tool as the server user (`postgres` when we are root); its stdout."""
    prefix = ["runuser", "-u", "postgres", "--"] if os.geteuid() == 0 else []
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PG", "MEMORIA_"))}
    done = subprocess.run(
        [*prefix, *command],
        cwd="/",  # as root our cwd may be closed to postgres
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
        start_new_session=True,  # a Ctrl-C of pytest does not reach the cluster
    )
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(command[:2])} failed:\n{done.stderr[-2000:]}")
    return done.stdout


def _bindir() -> Path:
    """The newest Debian server install, as scripts/pg.sh picks it."""
    found = sorted(
        Path("/usr/lib/postgresql").glob("*/bin/initdb"), key=lambda p: int(p.parent.parent.name)
    )
    if not found:
        raise RuntimeError("no PostgreSQL server binaries under /usr/lib/postgresql")
    return found[-1].parent


def _postmaster_pid(data: Path) -> int:
    return int((data / "postmaster.pid").read_text().split("\n", 1)[0])


def _children(pid: int) -> list[int]:
    """The processes whose parent is `pid` (the postmaster's backends and helpers)."""
    found = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:  # the process ended meanwhile
            continue
        if int(fields[1]) == pid:
            found.append(int(stat.parent.name))
    return found


def _alive(pid: int) -> bool:
    """Whether `pid` still runs (a zombie, ended but not yet reaped by its new parent, does
    not: it holds no socket and no file)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state not in ("Z", "X")


@dataclass
class ReplicatedPostgres:
    """The two clusters under `directory`; `start` sets both up (roles, the migrated `memoria`
    database, replication), `stop` ends whatever is left of them."""

    directory: Path
    primary_port: int
    standby_port: int
    primary: OwnPostgres = field(init=False)
    bindir: Path = field(init=False)
    primary_killed: bool = False

    def __post_init__(self) -> None:
        self.primary = OwnPostgres(self.directory / "primary", self.primary_port, durable=True)
        self.bindir = _bindir()

    @property
    def standby_data(self) -> Path:
        return self.directory / "standby" / "data"

    @property
    def primary_data(self) -> Path:
        """pg.sh's layout (scripts/pg.sh, "Layout")."""
        return self.directory / "primary" / "data"

    def url(self, user: str, password: str) -> str:
        """SQLAlchemy's multi-host URL of both servers: libpq tries them in turn and keeps the
        one that accepts writes (docs/operations.md, "Failover")."""
        return (
            f"postgresql+psycopg://{user}:{password}@/memoria"
            f"?host=127.0.0.1:{self.primary_port}&host=127.0.0.1:{self.standby_port}"
            "&target_session_attrs=read-write"
        )

    @property
    def app_url(self) -> str:
        return self.url("memoria_app", "memoria_app")

    @property
    def owner_url(self) -> str:
        return self.url("memoria_owner", "memoria_owner")

    def superuser(self, port: int) -> psycopg.Connection[tuple[object, ...]]:
        """The `postgres` superuser on one server (its password is in pg.sh's layout)."""
        password = (self.directory / "primary" / "superuser.password").read_text().strip()
        return psycopg.connect(
            host="127.0.0.1",
            port=port,
            user="postgres",
            password=password,
            dbname="postgres",
            autocommit=True,
            connect_timeout=5,
        )

    def start_primary(self) -> None:
        """The primary, with the roles and the `memoria` database (not yet migrated)."""
        self.primary.start()

    def start_standby(self) -> None:
        """Copy the primary (pg_basebackup -R: a standby that streams from it), start the copy,
        and make it the primary's synchronous standby; returns once it is in sync."""
        standby = self.directory / "standby"
        standby.mkdir(mode=0o755)
        run = standby / "run"
        run.mkdir(mode=0o700)
        if os.geteuid() == 0:
            for path in (standby, run):
                os.chown(path, *_postgres_ids())
        _as_server(
            str(self.bindir / "pg_basebackup"),
            *("-D", str(self.standby_data), "-R", "-X", "stream", "-c", "fast"),
            *("-h", "127.0.0.1", "-p", str(self.primary_port), "-U", "postgres", "-w"),
            *("-d", f"password={self._superuser_password()}"),
        )
        options = (
            f"-p {self.standby_port} -k {run} -c listen_addresses=127.0.0.1 "
            f"-c cluster_name={STANDBY_NAME} -c max_connections={MAX_CONNECTIONS} "
            "-c shared_buffers=128MB"
        )
        _as_server(
            str(self.bindir / "pg_ctl"),
            *("start", "-w", "-t", "60", "-D", str(self.standby_data)),
            *("-l", str(standby / "server.log"), "-o", options),
        )
        with self.superuser(self.primary_port) as conn:
            conn.execute(f"ALTER SYSTEM SET synchronous_standby_names = '{STANDBY_NAME}'")
            conn.execute("SELECT pg_reload_conf()")
            deadline = time.monotonic() + 30
            while True:  # bounded polling of the primary's own view of its standby
                row = conn.execute(
                    "SELECT sync_state FROM pg_stat_replication WHERE application_name = %s",
                    (STANDBY_NAME,),
                ).fetchone()
                if row is not None and row[0] == "sync":
                    return
                if time.monotonic() > deadline:
                    raise RuntimeError(f"the standby is not in sync after 30 s: {row}")
                time.sleep(0.05)

    def _superuser_password(self) -> str:
        return (self.directory / "primary" / "superuser.password").read_text().strip()

    def kill_primary(self) -> float:
        """SIGKILL to the primary's postmaster and every process of it at once, as when its
        machine is lost: nothing is flushed, nothing is shut down. Returns once all are gone,
        with the time (monotonic) the last signal was sent."""
        pid = _postmaster_pid(self.primary_data)
        self.primary_killed = True
        victims = [pid, *_children(pid)]
        for victim in victims:
            with contextlib.suppress(ProcessLookupError):
                os.kill(victim, signal.SIGKILL)
        killed = time.monotonic()
        deadline = time.monotonic() + 10
        while any(_alive(victim) for victim in victims):
            if time.monotonic() > deadline:
                raise RuntimeError("the primary's processes outlived SIGKILL for 10 s")
            time.sleep(0.01)
        return killed

    def promote(self) -> None:
        """`pg_ctl promote`: the standby ends recovery and accepts writes (-w: returns once it
        does)."""
        _as_server(
            str(self.bindir / "pg_ctl"), "promote", "-w", "-t", "60", "-D", str(self.standby_data)
        )

    def stop(self) -> None:
        """Stop whatever still runs (immediate: the test's data is thrown away)."""
        errors = []
        if (self.standby_data / "postmaster.pid").exists():
            try:
                _as_server(
                    str(self.bindir / "pg_ctl"),
                    "stop",
                    "-m",
                    "immediate",
                    "-D",
                    str(self.standby_data),
                )
            except RuntimeError as error:
                errors.append(error)
        # A killed primary has nothing left to stop (and its postmaster may linger as a zombie
        # no process reaps, which pg_ctl would take for a running server).
        if not self.primary_killed:
            try:
                self.primary.stop()
            except RuntimeError as error:
                errors.append(error)
        if errors:
            raise errors[0]


def _postgres_ids() -> tuple[int, int]:
    entry = pwd.getpwnam("postgres")
    return entry.pw_uid, entry.pw_gid
