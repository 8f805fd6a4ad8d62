"""Process handling shared by the benchmark drivers: the ghz binary, the server under test,
stopping a process, SIGTERM, and the report's common lines.

Standard library only at import time (a driver that measures other servers needs nothing
else), so the gRPC imports that waiting for a `memoria serve` needs are made where they are
used. The data, databases and calls the drivers share are in harness.py.
"""

from __future__ import annotations

import contextlib
import os
import platform
import signal
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import FrameType
from typing import IO, Any

GHZ_SH = Path(__file__).resolve().parent / "ghz.sh"
HOST = "127.0.0.1"  # the only address the drivers bind or target
REPO = Path(__file__).resolve().parent.parent


class Interrupted(Exception):
    """SIGTERM arrived: unwind like Ctrl-C so every `finally` stops what it started."""


class BudgetExceeded(Exception):
    """The next run or step would not fit in the time budget."""


def _on_sigterm(_signum: int, _frame: FrameType | None) -> None:
    raise Interrupted("SIGTERM")


def raise_on_sigterm() -> None:
    """From now on SIGTERM raises `Interrupted` in the main thread."""
    signal.signal(signal.SIGTERM, _on_sigterm)


def find_ghz() -> str:
    """The ghz path printed by bench/ghz.sh (which installs the pinned ghz on first use)."""
    out = subprocess.run(["bash", str(GHZ_SH)], stdout=subprocess.PIPE, check=False, timeout=600)
    path = out.stdout.decode().strip().splitlines()[-1:] if out.returncode == 0 else []
    if not path or not os.access(path[0], os.X_OK):
        raise SystemExit(f"{GHZ_SH} failed (exit {out.returncode}); see its stderr above")
    return path[0]


def stop_process(proc: subprocess.Popen[bytes], timeout_s: float) -> None:
    """SIGTERM, then SIGKILL if it has not exited within `timeout_s`."""
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def percentile_ms(report: dict[str, Any], pct: int) -> float:
    """A latency percentile of a ghz JSON report (`-O json`), in milliseconds."""
    for item in report.get("latencyDistribution") or []:
        if item["percentage"] == pct:
            return float(item["latency"]) / 1e6  # ghz reports nanoseconds
    return float("nan")


def machine_line() -> str:
    """The report's `machine:` line, with the load average now (at the end of a run)."""
    load = os.getloadavg()
    return (
        f"machine: {os.cpu_count()} cpus ({len(os.sched_getaffinity(0))} usable), "
        f"{platform.machine()}, load average {load[0]:.2f} {load[1]:.2f} {load[2]:.2f} at the end"
    )


def software_line(*more: str) -> str:
    """The report's `software:` line: Python, grpcio, then `more` (e.g. "ghz v0.121.0")."""
    import grpc

    return ", ".join(
        [f"software: python {platform.python_version()}", f"grpcio {grpc.__version__}", *more]
    )


RUN_ENDED: tuple[type[BaseException], ...] = (
    BudgetExceeded,
    KeyboardInterrupt,
    Interrupted,
    RuntimeError,
    subprocess.TimeoutExpired,
)
"""What may end a driver's measuring early and still leave a report (`failure_outcome`)."""


def failure_outcome(error: BaseException) -> str:
    """How a report names what ended a driver's measuring early: the time budget, Ctrl-C or
    SIGTERM, or else a failure (a failed ghz run, an error the driver expects)."""
    if isinstance(error, BudgetExceeded):
        return f"time budget reached before {error}"
    if isinstance(error, (KeyboardInterrupt, Interrupted)):
        return "interrupted"
    return f"failed: {error}"


def _proc_stat(pid: int) -> list[str]:
    """/proc/PID/stat's fields after the command name (field 3, the state, is index 0)."""
    return Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()


def process_cpu_seconds(pid: int) -> float:
    """User + system CPU time process `pid` has used so far (all its threads)."""
    fields = _proc_stat(pid)
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def parent_pid(pid: int) -> int | None:
    """The parent of `pid`, or None when this machine's /proc does not show it."""
    try:
        return int(_proc_stat(pid)[1])
    except (OSError, IndexError, ValueError):
        return None


def process_tree_cpu_seconds(root: int) -> float:
    """CPU time used so far by `root` and its live children (e.g. a PostgreSQL postmaster
    and its backends; a backend that has exited no longer counts)."""
    total = process_cpu_seconds(root)
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = _proc_stat(int(entry.name))
            if int(fields[1]) == root:
                total += (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
        except (OSError, IndexError, ValueError):
            continue  # exited meanwhile
    return total


@dataclass(frozen=True)
class Memory:
    """A process's resident memory in MiB (from /proc/<pid>/status): the total (VmRSS) and
    its anonymous part (heap, arenas: where a leak shows) and file-backed part (mapped files,
    such as the embedded engine's segments and the model: grows with the data, reclaimable)."""

    rss: float
    anon: float
    file: float

    @classmethod
    def of(cls, pid: int) -> Memory:
        """Read now; nan once the process is gone."""
        status = Path(f"/proc/{pid}/status")
        fields: dict[str, float] = {}
        for line in status.read_text().splitlines() if status.exists() else []:
            key, _, value = line.partition(":")
            if key in ("VmRSS", "RssAnon", "RssFile", "RssShmem"):
                fields[key] = int(value.split()[0]) / 1024  # kB
        nan = float("nan")
        return cls(
            fields.get("VmRSS", nan),
            fields.get("RssAnon", nan),
            fields.get("RssFile", nan) + fields.get("RssShmem", 0.0),
        )


def _server_command() -> list[str]:
    """`memoria` from the interpreter's environment (the venv running this script)."""
    script = Path(sys.executable).parent / "memoria"
    return [str(script)] if script.exists() else [sys.executable, "-m", "server"]


class ServerProcess:
    """`memoria serve` on 127.0.0.1:0 in its own session; `stop()` always reaps it.

    `server_args` name its store (`--data-dir DIR` or `--database-url URL`), `env` is added
    to this process's environment, `service` is the name whose health means ready, and
    `stop_timeout_s` how long `stop()` waits after SIGTERM before SIGKILL. A separate
    process, so a client here does not share the server's GIL more than any real client on
    the same machine would. Its output goes to `workdir/server.log`, the port it bound is
    read from `workdir/port`. `command` runs instead of `memoria` (a driver's wrapper that
    serves with other components, such as bench/serve_embedder.py); `serve` and the flags
    follow it.
    """

    def __init__(
        self,
        server_args: Sequence[str],
        workdir: Path,
        *,
        service: str,
        stop_timeout_s: float,
        env: Mapping[str, str] | None = None,
        command: Sequence[str] | None = None,
    ) -> None:
        self._log: IO[bytes] = (workdir / "server.log").open("w+b")
        self._port_file = workdir / "port"
        self._service = service
        self._stop_timeout_s = stop_timeout_s
        cmd = [
            *(command or _server_command()),
            "serve",
            "--listen",
            f"{HOST}:0",
            "--port-file",
            str(self._port_file),
            *server_args,
        ]
        # Its own session: Ctrl-C reaches only this driver, which then stops the server in
        # order (SIGTERM, drain, exit) instead of racing it.
        self.proc = subprocess.Popen(
            cmd,
            cwd=REPO,
            env=os.environ | {"MEMORIA_SHUTDOWN_GRACE_SECONDS": "2"} | dict(env or {}),
            stdin=subprocess.DEVNULL,
            stdout=self._log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        self.port = 0

    def wait_serving(self, timeout_s: float) -> float:
        """Wait for the port file, then for the health service to answer SERVING; return the
        seconds it took."""
        import grpc
        from grpc_health.v1 import health_pb2, health_pb2_grpc

        started = time.monotonic()
        deadline = started + timeout_s
        while not self.port:
            if self.proc.poll() is not None:
                raise RuntimeError(f"the server exited ({self.proc.returncode}):\n{self.log()}")
            if time.monotonic() > deadline:
                raise RuntimeError(f"no port file after {timeout_s:.0f}s:\n{self.log()}")
            content = self._port_file.read_text().strip() if self._port_file.exists() else ""
            if content.isdigit():
                self.port = int(content)
            else:
                time.sleep(0.1)
        request = health_pb2.HealthCheckRequest(service=self._service)
        with grpc.insecure_channel(f"{HOST}:{self.port}") as channel:
            stub = health_pb2_grpc.HealthStub(channel)
            while True:
                try:
                    reply = stub.Check(request, timeout=1)
                    if reply.status == health_pb2.HealthCheckResponse.SERVING:
                        return time.monotonic() - started
                except grpc.RpcError:
                    pass
                if time.monotonic() > deadline:
                    raise RuntimeError(f"not SERVING after {timeout_s:.0f}s:\n{self.log()}")
                time.sleep(0.1)

    def cpu_seconds(self) -> float:
        """User + system CPU time the server process has used so far (all its threads)."""
        return process_cpu_seconds(self.proc.pid)

    def pin_apart(self) -> str:
        """Run the server on CPU 0 only and this driver (and so every ghz it starts from now
        on) on the other CPUs, so the client's CPU per call no longer takes from the server's
        (in a deployment the callers run elsewhere). Every thread of the server is pinned, and
        a thread it starts later inherits its creator's CPU. Returns what was done, for the
        report."""
        cpus = sorted(os.sched_getaffinity(0))
        if len(cpus) < 2:
            raise SystemExit("pinning the server and ghz apart needs at least 2 CPUs")
        server_cpu, rest = {cpus[0]}, set(cpus[1:])
        for tid in os.listdir(f"/proc/{self.proc.pid}/task"):
            with contextlib.suppress(ProcessLookupError):  # a thread that ended meanwhile
                os.sched_setaffinity(int(tid), server_cpu)
        os.sched_setaffinity(0, rest)
        return f"server pinned to CPU {cpus[0]}, ghz to CPUs {sorted(rest)}"

    def os_threads(self) -> int:
        """The server process's OS threads now, -1 once it is gone."""
        status = Path(f"/proc/{self.proc.pid}/status")
        for line in status.read_text().splitlines() if status.exists() else []:
            if line.startswith("Threads:"):
                return int(line.split()[1])
        return -1

    def log(self) -> str:
        """The last 4,000 characters the server wrote (stdout and stderr)."""
        self._log.flush()
        self._log.seek(0)
        return self._log.read().decode(errors="replace")[-4000:]

    def stop(self) -> None:
        stop_process(self.proc, self._stop_timeout_s)
        self._log.close()
