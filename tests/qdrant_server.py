"""A real Qdrant server for the tests and the benchmarks, as they find or start it.

Where from, in order:
- MEMORIA_TEST_QDRANT_URL: a server the user runs (a container, another machine's), its REST
  URL; its gRPC port is MEMORIA_TEST_QDRANT_GRPC_PORT, else the URL's port + 1 (Qdrant's own
  layout, as the server's settings derive it). The tests share it and isolate themselves by
  collection names of their own.
- MEMORIA_TEST_QDRANT_BIN, else `../shared/qdrant/qdrant` beside the repository when present:
  a Qdrant binary, started on loopback on free ports (Qdrant refuses port 0) with a scratch
  storage directory, stopped with SIGTERM at the end.

Tests that stop or kill a server start one of their own (`QdrantProcess`, restartable on the
same ports and storage), and the cluster test a few nodes of one cluster (`qdrant_cluster`).
Qdrant is given one optimizer and one search thread: the test machines have 2 cores shared by
everything else the suite runs.
"""

from __future__ import annotations

import contextlib
import os
import random
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
from qdrant_client import QdrantClient

from server.adapters.qdrant.server import server_client
from server.runtime.settings import Settings
from tests.postgres_server import free_port

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_BINARY = ROOT.parent / "shared" / "qdrant" / "qdrant"
START_TIMEOUT_S = 60.0
STOP_TIMEOUT_S = 20.0


@dataclass(frozen=True)
class QdrantEndpoint:
    """Where a Qdrant server answers: its REST URL and its gRPC port."""

    url: str
    grpc_port: int

    def client(self, *, prefer_grpc: bool = True) -> QdrantClient:
        """A client as Memoria's own (server/runtime/app.py) makes one."""
        return server_client(self.url, grpc_port=self.grpc_port, prefer_grpc=prefer_grpc)

    def env(self) -> dict[str, str]:
        """The MEMORIA_* settings that point a `memoria` process at this server."""
        return {"MEMORIA_QDRANT_URL": self.url, "MEMORIA_QDRANT_GRPC_PORT": str(self.grpc_port)}


def free_port_pair() -> int:
    """A loopback port P with P + 1 free too (Qdrant's REST and gRPC ports; it refuses 0),
    below the kernel's ephemeral range: a port from that range can be taken, between this
    probe and the server's bind, by any outgoing connection of the suite."""
    ephemeral_low = 32768
    with contextlib.suppress(OSError, ValueError):
        ephemeral_low = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    for _ in range(200):
        port = random.randrange(10000, ephemeral_low - 1)
        with socket.socket() as rest, socket.socket() as grpc_port:
            try:
                rest.bind(("127.0.0.1", port))
                grpc_port.bind(("127.0.0.1", port + 1))
            except OSError:
                continue
            return port
    raise AssertionError("no two consecutive free ports on loopback")


def qdrant_binary() -> Path | None:
    """The Qdrant binary to start: MEMORIA_TEST_QDRANT_BIN, else the shared one if present."""
    given = os.environ.get("MEMORIA_TEST_QDRANT_BIN")
    if given:
        return Path(given)
    return DEFAULT_BINARY if DEFAULT_BINARY.is_file() else None


def given_endpoint() -> QdrantEndpoint | None:
    """The server named by MEMORIA_TEST_QDRANT_URL (and _GRPC_PORT), if any."""
    url = os.environ.get("MEMORIA_TEST_QDRANT_URL")
    if not url:
        return None
    grpc_port = os.environ.get("MEMORIA_TEST_QDRANT_GRPC_PORT")
    settings = Settings(qdrant_url=url, qdrant_grpc_port=int(grpc_port) if grpc_port else None)
    return QdrantEndpoint(url, settings.qdrant.effective_grpc_port)


@dataclass
class QdrantProcess:
    """One Qdrant server process on loopback, with its storage under `directory`. It can be
    stopped, killed and started again on the same ports and storage."""

    binary: Path
    directory: Path
    http_port: int = 0
    grpc_port: int = 0
    process: subprocess.Popen[bytes] | None = None
    cluster: bool = False
    """A node of a cluster: a p2p port, and `bootstrap` (the first node's p2p URL) unless it
    is the first."""
    p2p_port: int = 0
    bootstrap: str | None = None
    optimizer_threads: int = 1
    """QDRANT__STORAGE__PERFORMANCE__MAX_OPTIMIZATION_THREADS: 1 for the tests (see the module
    docstring); a bulk load gives the optimizer more."""

    def __post_init__(self) -> None:
        taken: set[int] = set()
        for name in ("http_port", "grpc_port", *(("p2p_port",) if self.cluster else ())):
            while not getattr(self, name) or getattr(self, name) in taken:
                setattr(self, name, free_port())
            taken.add(getattr(self, name))

    @property
    def p2p_url(self) -> str:
        return f"http://127.0.0.1:{self.p2p_port}"

    @property
    def endpoint(self) -> QdrantEndpoint:
        return QdrantEndpoint(f"http://127.0.0.1:{self.http_port}", self.grpc_port)

    @property
    def log(self) -> Path:
        return self.directory / "qdrant.log"

    def start(self) -> QdrantEndpoint:
        """Start the server and return once it reports ready (or raise with its log)."""
        if not os.access(self.binary, os.X_OK):
            raise RuntimeError(f"no executable Qdrant binary at {self.binary}")
        self.directory.mkdir(parents=True, exist_ok=True)
        env = {
            "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
            "QDRANT__SERVICE__HOST": "127.0.0.1",
            "QDRANT__SERVICE__HTTP_PORT": str(self.http_port),
            "QDRANT__SERVICE__GRPC_PORT": str(self.grpc_port),
            "QDRANT__STORAGE__STORAGE_PATH": str(self.directory / "storage"),
            "QDRANT__STORAGE__SNAPSHOTS_PATH": str(self.directory / "snapshots"),
            "QDRANT__STORAGE__PERFORMANCE__MAX_SEARCH_THREADS": "1",
            "QDRANT__STORAGE__PERFORMANCE__MAX_OPTIMIZATION_THREADS": str(self.optimizer_threads),
            "QDRANT__TELEMETRY_DISABLED": "true",
            "QDRANT__LOG_LEVEL": "WARN",
        }
        command = [str(self.binary)]
        if self.cluster:
            env |= {
                "QDRANT__CLUSTER__ENABLED": "true",
                "QDRANT__CLUSTER__P2P__PORT": str(self.p2p_port),
            }
            command += ["--uri", self.p2p_url]
            if self.bootstrap is not None:
                command += ["--bootstrap", self.bootstrap]
        with self.log.open("ab") as out:
            self.process = subprocess.Popen(
                command,
                cwd=self.directory,
                env=env,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,  # a Ctrl-C of pytest does not reach it first
            )
        self.wait_ready()
        return self.endpoint

    def wait_ready(self) -> None:
        """Poll /readyz until it answers 200, within START_TIMEOUT_S."""
        deadline = time.monotonic() + START_TIMEOUT_S
        url = f"{self.endpoint.url}/readyz"
        while time.monotonic() < deadline:
            if self.process is not None and self.process.poll() is not None:
                raise RuntimeError(f"Qdrant exited at start:\n{self._log_tail()}")
            with contextlib.suppress(httpx.TransportError):
                if httpx.get(url, timeout=1.0).status_code == 200:
                    return
            time.sleep(0.05)  # polling a starting server, bounded by the deadline
        raise RuntimeError(f"Qdrant not ready after {START_TIMEOUT_S}s:\n{self._log_tail()}")

    def stop(self) -> None:
        """SIGTERM (Qdrant flushes and exits 0), then SIGKILL if it hangs."""
        if self.process is None or self.process.poll() is not None:
            return
        self.process.send_signal(signal.SIGTERM)
        try:
            self.process.wait(timeout=STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            self.kill()

    def kill(self) -> None:
        """SIGKILL: an outage, not a shutdown."""
        if self.process is not None and self.process.poll() is None:
            self.process.kill()
            self.process.wait(timeout=STOP_TIMEOUT_S)

    def _log_tail(self) -> str:
        try:
            return self.log.read_text(errors="replace")[-3000:]
        except OSError:
            return "(no log)"


@contextlib.contextmanager
def qdrant_process(
    directory: Path, binary: Path | None = None, *, optimizer_threads: int = 1
) -> Iterator[QdrantProcess]:
    """A started Qdrant server of the caller's own (stopped at the end), from `binary` or
    qdrant_binary(), with `optimizer_threads` optimization threads; RuntimeError when there
    is none or it does not start."""
    binary = binary or qdrant_binary()
    if binary is None:
        raise RuntimeError(
            f"no Qdrant binary: set MEMORIA_TEST_QDRANT_BIN (looked for {DEFAULT_BINARY})"
        )
    server = QdrantProcess(binary, directory, optimizer_threads=optimizer_threads)
    try:
        server.start()
        yield server
    finally:
        server.stop()


@contextlib.contextmanager
def qdrant_cluster(directory: Path, nodes: int = 3) -> Iterator[list[QdrantProcess]]:
    """A cluster of `nodes` Qdrant servers on loopback (each waited for before the next, as
    Qdrant's docs ask), storage under `directory`; every node stopped at the end."""
    binary = qdrant_binary()
    if binary is None:
        raise RuntimeError(
            f"no Qdrant binary: set MEMORIA_TEST_QDRANT_BIN (looked for {DEFAULT_BINARY})"
        )
    started: list[QdrantProcess] = []
    try:
        for i in range(nodes):
            node = QdrantProcess(
                binary,
                directory / f"node{i}",
                cluster=True,
                bootstrap=started[0].p2p_url if started else None,
            )
            started.append(node)
            node.start()
        yield started
    finally:
        for node in reversed(started):
            node.stop()


@contextlib.contextmanager
def scratch_dir(fallback: Path) -> Iterator[Path]:
    """A directory for a test server's storage, in memory (/dev/shm) where there is one:
    Qdrant syncs every collection it creates, which costs 4x as much on a disk (measured:
    ~0.2 s against ~0.05 s per collection); removed at the end. Else `fallback`."""
    shm = Path("/dev/shm")
    if not (shm.is_dir() and os.access(shm, os.W_OK)):
        yield fallback
        return
    directory = Path(tempfile.mkdtemp(prefix="memoria-qdrant-", dir=shm))
    try:
        yield directory
    finally:
        shutil.rmtree(directory, ignore_errors=True)


@contextlib.contextmanager
def suite_qdrant(directory: Path) -> Iterator[QdrantEndpoint]:
    """The suite's Qdrant server: the one MEMORIA_TEST_QDRANT_URL names, else one started
    from the binary with its storage in memory or under `directory`."""
    given = given_endpoint()
    if given is not None:
        yield given
        return
    with scratch_dir(directory) as storage, qdrant_process(storage) as server:
        yield server.endpoint
