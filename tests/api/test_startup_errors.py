"""What a newcomer sees when a command cannot start: one clear line and a non-zero exit.

A database URL that points nowhere (a typo, a server not started yet) is the most common first
mistake; the driver's traceback says the same thing in forty lines of its internals.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.processes import clean_env, failed_in_one_line

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
    assert "s3cret-pw" not in stderr
