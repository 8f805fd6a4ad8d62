"""Process handling shared by the benchmark drivers: the ghz binary, stopping a server."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path
from typing import Any

GHZ_SH = Path(__file__).resolve().parent / "ghz.sh"


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
