"""The scripted model turn (model_turn.json) against the real server, on SQLite and PostgreSQL.

The runner calls the raw stubs, so this checks the server's ModelToolService: the words every
adapter, MCP and framework integration hands the model come from here.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.api.conftest import server_settings, serving
from tests.conformance.model_turn import Runner, fresh_identity, load
from tests.conftest import SQL_KINDS


@pytest.mark.parametrize("kind", SQL_KINDS)
def test_the_server_answers_the_scripted_turn_word_for_word(
    kind: str, request: pytest.FixtureRequest, tmp_path: Path
) -> None:
    data = load()
    kinds = {step["call"] for step in data["steps"]}
    assert kinds == {
        "GetModelTools",
        "RenderPromptSection",
        "ExecuteToolCall",
        "IndexTurn",
        "UpdateMemorySettings",
        "GetTurnInspection",
    }
    with serving(server_settings(kind, request, tmp_path)) as api:
        mismatches = Runner(api.channel, fresh_identity()).run(data)
    assert not mismatches, "\n".join(map(str, mismatches))
