"""The scripted model turn (model_turn.json) through the Python turn adapter, on a real server.

The Go and TypeScript adapters play the same data in scripts/test-clients.sh (go test in
clients/go, node:test in clients/ts).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.api.conftest import server_settings, serving
from tests.conformance.adapter_turn import AdapterRunner
from tests.conformance.model_turn import fresh_identity, load


def test_the_python_adapter_gives_the_model_the_scripted_words(
    request: pytest.FixtureRequest, tmp_path: Path
) -> None:
    with serving(server_settings("sqlite", request, tmp_path)) as api:
        runner = AdapterRunner(api.channel, fresh_identity())
        mismatches = runner.run(load())
    assert not mismatches, "\n".join(map(str, mismatches))
