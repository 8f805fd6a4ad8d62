"""The throwaway PostgreSQL of scripts/pg.sh, as the tests and the benchmarks find it."""

from __future__ import annotations

import os
import subprocess
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
