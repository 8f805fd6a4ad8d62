"""Several serving processes on one port: `memoria serve --processes N` (alias `--workers`).

One Python process is bound by one core (the GIL), so using N cores takes N processes. This
module is the parent of those processes: it reserves the port, starts N ordinary
`memoria serve` processes (its children) that all listen on it, restarts a child that dies,
and on SIGTERM lets every child drain before it exits.

Decisions:
- **SO_REUSEPORT, not pre-fork.** Each child is a fresh interpreter (fork + exec) that builds
  its own gRPC server and binds the same HOST:PORT with `grpc.so_reuseport` set; the kernel
  spreads incoming connections over the listening sockets. A pre-fork model (one socket bound
  by the parent, inherited by forked children) is not available with grpcio: it cannot serve
  on an inherited listening socket, and its core is not fork-safe once started. Exec'd
  children also share nothing by accident: each has its own pools, read cache and listener,
  exactly like replicas behind a load balancer, which the service already supports.
- **The kernel balances connections, not calls.** A client with one HTTP/2 connection reaches
  one child; load spreads over the children when it arrives on several connections (many
  clients, a mesh's connection pool, ghz `--connections`).
- **Port 0 and the port file.** With port 0 the parent binds a socket to a free port with
  SO_REUSEPORT and keeps it (bound, never listening: the kernel hands connections to
  listening sockets only) for its whole life, then starts the children on that port. So the
  port cannot be taken by another program between choosing it and the children binding it,
  nor while every child is being restarted. A fixed port is reserved the same way, after a
  check that nothing listens there yet (SO_REUSEPORT would otherwise share it silently with
  another server of the same user). `--port-file` is written once every child serves.
- **Only shared stores.** The embedded stores belong to one process (`refusal`).
- **Page tokens.** Without `MEMORIA_PAGE_TOKEN_SECRET` a PostgreSQL server signs page tokens
  with a key of its own process; the parent draws one key and gives it to all its children,
  so a token from one child is valid on the next page served by another.
- **Supervision.** A child that exits after it served is started again after a delay that
  doubles with each quick failure (0.5 s up to 30 s; back to 0.5 s once a child has run for a
  minute). A child that fails during the first start stops the whole group with an error:
  that is a configuration problem, and restarting would only repeat it. Children die with
  their parent (PR_SET_PDEATHSIG), so a killed parent leaves no server behind.
- **Shutdown.** SIGTERM (or SIGINT) is forwarded to every child; each reports NOT_SERVING,
  drains its calls for the grace period and exits; the parent exits 0 once all have, or kills
  the ones still running after the grace period plus a margin and exits 1.
"""

from __future__ import annotations

import contextlib
import ctypes
import logging
import os
import secrets
import select
import signal
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType

from server.runtime.settings import Settings, StartupRefusal, listen_host

log = logging.getLogger(__name__)

BACKOFF_FIRST_S = 0.5
BACKOFF_MAX_S = 30.0
STABLE_AFTER_S = 60.0  # a child that ran this long before it died starts a new backoff
START_TIMEOUT_S = 120.0  # from spawn to serving (loads the embedding model, checks stores)
STOP_MARGIN_S = 10.0  # after the grace period, before stragglers are killed
_PR_SET_PDEATHSIG = 1


def refusal(settings: Settings) -> str | None:
    """Why these settings cannot run several serving processes, or None if they can."""
    if settings.serve.processes == 1:
        return None
    embedded = []
    if settings.store.embedded:
        embedded.append(
            "SQLite (no --database-url): the server reads it through an in-process cache and "
            "tombstone list that are exact only while its own process is the only writer"
        )
    if settings.qdrant.embedded:
        embedded.append(
            "the embedded Qdrant engine (no --qdrant-url): one process owns the store under "
            "the data dir and holds its lock, so a second process cannot open it"
        )
    if not embedded:
        return None
    return (
        f"--processes {settings.serve.processes} needs stores that several processes can share: "
        "PostgreSQL (--database-url) and a Qdrant server (--qdrant-url). These belong to one "
        "process: " + "; ".join(embedded) + ". Run one process (--processes 1), or move to "
        "PostgreSQL and a Qdrant server (docs/operations.md: 'A Qdrant server or cluster')."
    )


def name_this_process(role: str) -> None:
    """Put `role[pid]` on every log line of this process (the children share one stream),
    as the `process` field of its JSON lines (server/telemetry/logs.py)."""
    from server.telemetry import JsonFormatter

    for handler in logging.getLogger().handlers:
        handler.setFormatter(JsonFormatter(process=f"{role}[{os.getpid()}]"))


def pin_this_process(index: int | None) -> int:
    """Run every thread of this process, and every thread it starts from now on (a thread
    inherits its creator's CPUs), on one CPU of those it may use: the first for a single
    process, the i-th (round robin) for process i of `--processes` (`index`, from 1). Returns
    the CPU. MEMORIA_PIN_CPU; why: docs/decisions.md, "One CPU per serving process"."""
    allowed = sorted(os.sched_getaffinity(0))
    cpu = allowed[((index or 1) - 1) % len(allowed)]
    for task in os.listdir("/proc/self/task"):
        with contextlib.suppress(ProcessLookupError):  # a thread that ended meanwhile
            os.sched_setaffinity(int(task), {cpu})
    return cpu


def reserve_port(listen: str) -> tuple[socket.socket, int]:
    """Bind HOST:PORT (PORT may be 0) with SO_REUSEPORT and keep it; returns it and its port.

    Raises OSError if another program already serves on a fixed port.
    """
    port_text = listen.rpartition(":")[2]
    name = listen_host(listen)
    family, kind, proto, _, address = socket.getaddrinfo(
        name or None, int(port_text), type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE
    )[0]
    if int(port_text) != 0:
        with socket.socket(family, kind, proto) as probe:  # no SO_REUSEPORT: fails if taken
            probe.bind(address)
    sock = socket.socket(family, kind, proto)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        sock.bind(address)
    except BaseException:
        sock.close()
        raise
    return sock, int(sock.getsockname()[1])


def _child_setup() -> None:
    """In the child between fork and exec: die with the parent (Linux)."""
    with contextlib.suppress(OSError, AttributeError):
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)


@dataclass
class _Child:
    """One slot of the group: its current process, if any, and its restart state."""

    index: int
    port_file: Path
    process: subprocess.Popen[bytes] | None = None
    started: float = 0.0
    serving: bool = False
    failures: int = 0
    restart_at: float | None = None

    @property
    def name(self) -> str:
        pid = self.process.pid if self.process is not None else "-"
        return f"worker {self.index} (pid {pid})"


@dataclass
class Supervisor:
    """Runs `count` children of `memoria serve` on one port until SIGTERM or SIGINT.

    `child_args` are the `serve` arguments every child gets (flags the operator gave), to
    which the supervisor adds the listen address, the worker count and the child's index.
    """

    settings: Settings
    child_args: list[str]
    port_file: Path | None = None
    _children: list[_Child] = field(default_factory=list)
    _stop_signal: int | None = None
    _env: dict[str, str] = field(default_factory=dict)
    _listen: str = ""

    def run(self) -> int:
        """Serve until told to stop; the exit status for the command. A port that cannot be
        reserved refuses the start (StartupRefusal)."""
        count = self.settings.serve.processes
        try:
            reserved, port = reserve_port(self.settings.serve.listen)
        except OSError as error:  # the command prints it in one line, naming --listen
            listen = self.settings.serve.listen
            raise StartupRefusal(f"cannot listen on {listen}: {error.strerror}", "listen") from None
        host = self.settings.serve.listen.rpartition(":")[0]
        self._listen = f"{host}:{port}"
        self._env = dict(os.environ)
        if self.settings.serve.page_token_secret is None:
            self._env["MEMORIA_PAGE_TOKEN_SECRET"] = secrets.token_urlsafe(32)
            log.warning(
                "MEMORIA_PAGE_TOKEN_SECRET is not set: the %d workers share a key drawn now, "
                "valid for this group only; set the same secret on every replica",
                count,
            )
        wake_r, wake_w = os.pipe()
        os.set_blocking(wake_r, False)
        os.set_blocking(wake_w, False)
        previous = {
            signum: signal.signal(signum, self._on_signal)
            for signum in (signal.SIGTERM, signal.SIGINT, signal.SIGCHLD)
        }
        old_wakeup = signal.set_wakeup_fd(wake_w, warn_on_full_buffer=False)
        try:
            with tempfile.TemporaryDirectory(prefix="memoria-workers-") as tmp:
                self._children = [
                    _Child(i, Path(tmp) / f"worker-{i}.port") for i in range(1, count + 1)
                ]
                log.info("starting %d workers on %s (pid %d)", count, self._listen, os.getpid())
                for child in self._children:
                    self._spawn(child)
                if self._supervise(wake_r, port):
                    return self._shutdown(wake_r, f"signal {self._stop_signal}")
                self._shutdown(wake_r, "a worker failed to start")
                return 1
        finally:
            for child in self._children:  # only after an unexpected error: kill, never orphan
                if child.process is not None and child.process.poll() is None:
                    child.process.kill()
                    child.process.wait()
            signal.set_wakeup_fd(old_wakeup)
            for signum, handler in previous.items():
                signal.signal(signum, handler)
            os.close(wake_r)
            os.close(wake_w)
            reserved.close()

    def _on_signal(self, signum: int, _frame: FrameType | None) -> None:
        if signum != signal.SIGCHLD and self._stop_signal is None:
            self._stop_signal = signum  # the loop wakes through the wakeup fd

    def _spawn(self, child: _Child) -> None:
        child.port_file.unlink(missing_ok=True)
        command = [
            sys.executable,
            "-m",
            "server",
            "serve",
            *self.child_args,
            "--listen",
            self._listen,
            "--processes",
            str(self.settings.serve.processes),
            "--port-file",
            str(child.port_file),
            "--process-index",
            str(child.index),
        ]
        child.process = subprocess.Popen(command, env=self._env, preexec_fn=_child_setup)
        child.started = time.monotonic()
        child.serving = False
        child.restart_at = None
        log.info("%s started", child.name)

    def _supervise(self, wake_r: int, port: int) -> bool:
        """The loop: True at a stop signal, False when a child fails during the first start."""
        announced = False
        while self._stop_signal is None:
            now = time.monotonic()
            for child in self._children:
                process = child.process
                if process is not None and (code := process.poll()) is not None:
                    if not announced:
                        log.error(
                            "%s exited with status %s before the group served; stopping",
                            child.name,
                            code,
                        )
                        return False
                    self._schedule_restart(child, code, now)
                elif process is not None and not child.serving:
                    if self._reported_port(child) is not None:
                        child.serving = True
                        log.info("%s is serving on port %d", child.name, port)
                    elif now - child.started > START_TIMEOUT_S:
                        log.error("%s did not serve within %.0fs", child.name, START_TIMEOUT_S)
                        process.kill()  # reaped, and restarted, on the next pass
                elif child.restart_at is not None and now >= child.restart_at:
                    self._spawn(child)
            if not announced and all(c.serving for c in self._children):
                announced = True
                log.info("all %d workers serve on port %d", len(self._children), port)
                if self.port_file is not None:
                    self.port_file.write_text(str(port))
            self._wait(wake_r, self._next_timeout(now))
        return True

    def _reported_port(self, child: _Child) -> int | None:
        content = child.port_file.read_text().strip() if child.port_file.exists() else ""
        return int(content) if content.isdigit() else None

    def _schedule_restart(self, child: _Child, code: int, now: float) -> None:
        ran = now - child.started
        child.failures = 1 if ran >= STABLE_AFTER_S else child.failures + 1
        delay = min(BACKOFF_FIRST_S * 2 ** (child.failures - 1), BACKOFF_MAX_S)
        log.warning(
            "%s exited with status %s after %.1fs; restarting in %.1fs",
            child.name,
            code,
            ran,
            delay,
        )
        child.process = None
        child.serving = False
        child.restart_at = now + delay

    def _next_timeout(self, now: float) -> float:
        """Poll quickly while a child starts (for its port file); else sleep until a restart
        is due or a signal arrives."""
        if any(c.process is not None and not c.serving for c in self._children):
            return 0.05
        due = [c.restart_at - now for c in self._children if c.restart_at is not None]
        return max(min(due, default=5.0), 0.0)

    @staticmethod
    def _wait(wake_r: int, timeout: float) -> None:
        """Sleep until a signal arrives (SIGCHLD, SIGTERM, SIGINT) or `timeout` passes."""
        readable, _, _ = select.select([wake_r], [], [], timeout)
        if readable:
            with contextlib.suppress(BlockingIOError):
                while os.read(wake_r, 512):
                    pass

    def _shutdown(self, wake_r: int, reason: str) -> int:
        """SIGTERM every child, wait for each to drain; 1 if one had to be killed."""
        live = [c for c in self._children if c.process is not None and c.process.poll() is None]
        log.info(
            "%s: stopping %d workers (each drains for up to %ss)",
            reason,
            len(live),
            self.settings.serve.shutdown_grace_seconds,
        )
        for child in live:
            assert child.process is not None
            child.process.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + self.settings.serve.shutdown_grace_seconds + STOP_MARGIN_S
        while any(c.process.poll() is None for c in live if c.process is not None):
            left = deadline - time.monotonic()
            if left <= 0:
                break
            self._wait(wake_r, min(left, 1.0))
        status = 0
        for child in live:
            assert child.process is not None
            if child.process.poll() is None:
                log.error("%s did not stop in time: killing it", child.name)
                child.process.kill()
                child.process.wait()
                status = 1
            else:
                log.info("%s exited with status %s", child.name, child.process.returncode)
        log.info("stopped")
        return status
