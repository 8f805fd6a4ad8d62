"""Process handling shared by the benchmark drivers."""

from __future__ import annotations

import subprocess


def stop_process(proc: subprocess.Popen[bytes], timeout_s: float) -> None:
    """SIGTERM, then SIGKILL if it has not exited within `timeout_s`."""
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
