"""Helpers for tests that run Memoria's commands as real processes."""

from __future__ import annotations

import json
import os
import subprocess
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
MEMORIA = ROOT / ".venv" / "bin" / "memoria"
"""The `memoria` command of the development venv."""


def clean_env(**settings: str) -> dict[str, str]:
    """This environment without MEMORIA_* settings, plus `settings`: only what a test gives
    counts."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("MEMORIA_")}
    env.update(settings)
    return env


def failed_in_one_line(args: list[str], cwd: Path, env: dict[str, str]) -> tuple[str, str]:
    """Run `memoria *args`, which must exit 1 without a traceback and print nothing but its
    JSON log before one last line; that line (the error) and the whole stderr."""
    done = subprocess.run(
        [str(MEMORIA), *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 1, done.stderr
    assert "Traceback" not in done.stderr
    *log, last = done.stderr.strip().splitlines()
    for line in log:  # nothing else was printed: only the JSON log came before the error
        assert line.startswith("{") and json.loads(line), done.stderr
    return last, done.stderr


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
        args = process.args
        command = " ".join(map(str, args)) if isinstance(args, list | tuple) else str(args)
        raise AssertionError(f"{command} exited with {code}:\n{log.read_text(errors='replace')}")
    raise AssertionError(f"no port file after {timeout}s:\n{log.read_text(errors='replace')}")
