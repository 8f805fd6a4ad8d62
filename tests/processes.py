"""Helpers for tests that run Memoria's commands as real processes."""

from __future__ import annotations

import subprocess
import time
from pathlib import Path


def wait_for_port(
    process: subprocess.Popen[bytes], port_file: Path, log: Path, *, timeout: float
) -> int:
    """The port a `memoria serve` / `memoria mcp` process writes to `port_file` once it
    listens (`--port-file`); polled for at most `timeout` seconds, failing at once with the
    process's log when it exits first."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        content = port_file.read_text().strip() if port_file.exists() else ""
        if content.isdigit():
            return int(content)
        try:
            code = process.wait(timeout=0.05)
        except subprocess.TimeoutExpired:
            continue
        raise AssertionError(
            f"{' '.join(map(str, process.args))} exited with {code}:\n"
            f"{log.read_text(errors='replace')}"
        )
    raise AssertionError(f"no port file after {timeout}s:\n{log.read_text(errors='replace')}")
