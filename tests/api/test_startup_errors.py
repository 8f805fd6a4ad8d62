"""What a newcomer sees when a command cannot start: one clear line naming the variable (and
flag) to change, and a non-zero exit.

A database URL that points nowhere (a typo, a server not started yet) is the most common first
mistake; the driver's traceback says the same thing in forty lines of its internals. A port
another process holds, and settings that do not validate, are the next ones. (An unreachable
Qdrant server: tests/api/test_qdrant_server.py; an unusable embeddings endpoint:
tests/api/test_embedding_endpoint_api.py.)
"""

from __future__ import annotations

import socket
import subprocess
from pathlib import Path

import pytest

from tests.processes import MEMORIA, clean_env, failed_in_one_line

# Port 1 on loopback: nothing listens there, so the connection is refused at once.
NOWHERE = "postgresql+psycopg://nobody:s3cret-pw@127.0.0.1:1/x"


@pytest.mark.parametrize(
    "command",
    [
        ["serve", "--listen", "127.0.0.1:0", "--database-url", NOWHERE],
        ["migrate", "--database-url", NOWHERE],
    ],
    ids=["serve", "migrate"],
)
def test_an_unreachable_database_is_one_line_and_a_failed_exit(
    command: list[str], tmp_path: Path
) -> None:
    # Everything before the last line is the JSON log (the redacted settings); the error is
    # the last line, alone, naming the command and what the driver said.
    last, stderr = failed_in_one_line(command, tmp_path, clean_env())
    assert last.startswith(f"memoria {command[0]}: cannot use the database: ")
    assert "Connection refused" in last
    assert last.endswith("; check MEMORIA_DATABASE_URL (or --database-url)")
    assert "s3cret-pw" not in stderr


def test_a_grpc_port_in_use_is_one_line_naming_the_setting(tmp_path: Path) -> None:
    """Another process holds the port: refused before the model loads, naming --listen."""
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        port = holder.getsockname()[1]
        last, _ = failed_in_one_line(
            ["serve", "--listen", f"127.0.0.1:{port}", "--data-dir", str(tmp_path / "d")],
            tmp_path,
            clean_env(),
        )
    assert last == (
        f"memoria serve: cannot listen on 127.0.0.1:{port}: Address already in use; "
        "check MEMORIA_LISTEN (or --listen)"
    )


def test_an_http_port_in_use_is_one_line_naming_the_setting(tmp_path: Path) -> None:
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        port = holder.getsockname()[1]
        last, _ = failed_in_one_line(
            ["serve", "--listen", "127.0.0.1:0", "--data-dir", str(tmp_path / "d")],
            tmp_path,
            clean_env(MEMORIA_HTTP_LISTEN=f"127.0.0.1:{port}"),
        )
    assert last == (
        f"memoria serve: cannot listen on 127.0.0.1:{port}: Address already in use; "
        "check MEMORIA_HTTP_LISTEN (or --http-listen)"
    )


def test_invalid_settings_are_one_line_each_naming_the_variable_and_flag(
    tmp_path: Path,
) -> None:
    """pydantic's multi-line report becomes one line per invalid setting, and nothing else:
    the flag is named where `memoria serve` has one; a secret's value is never echoed."""
    done = subprocess.run(
        [str(MEMORIA), "serve", "--listen", "nope", "--qdrant-grpc-port", "99999"],
        cwd=tmp_path,
        env=clean_env(
            MEMORIA_CHAR_LIMIT="0",
            MEMORIA_AUTH="none",
            MEMORIA_EMBEDDING_API_KEY="sk-not-echoed-77",
        ),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 1
    assert sorted(done.stderr.strip().splitlines()) == sorted(
        [
            'memoria serve: MEMORIA_LISTEN (or --listen): must be HOST:PORT (got "nope")',
            "memoria serve: MEMORIA_QDRANT_GRPC_PORT (or --qdrant-grpc-port): Input should be "
            "less than or equal to 65535 (got 99999)",
            'memoria serve: MEMORIA_CHAR_LIMIT: Input should be greater than 0 (got "0")',
            "memoria serve: MEMORIA_AUTH (or --auth): Input should be 'auto', 'jwt' or "
            "'trusted-headers' (got \"none\")",
            "memoria serve: MEMORIA_EMBEDDING_API_KEY: needs MEMORIA_EMBEDDING_URL (the "
            "endpoint's API base)",
        ]
    )
