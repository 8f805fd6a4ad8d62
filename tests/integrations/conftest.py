"""A real Memoria server for the framework integrations' tests, and the turn they all play.

Each test drives one framework with that framework's own test model: the model asks for one
memory_rewrite, reads what the tool returned, and answers. What the model must read comes from
the cross-language conformance data (tests/conformance/model_turn.json), never from a copy in
the test; `check_turn` then asks the server what happened: the block was saved, and
GetTurnInspection shows the turn's renders and its write.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from memoria.v1 import conversation_search_service_pb2 as search_pb
from memoria.v1 import memory_block_pb2 as block_pb
from memoria.v1 import memory_block_service_pb2 as blocks_pb
from memoria_client import MemoriaTurnAdapter
from tests.api.conftest import Api, server_settings, serving

CONFORMANCE = Path(__file__).resolve().parents[1] / "conformance" / "model_turn.json"


@dataclass(frozen=True)
class ScriptedTurn:
    """The turn every integration test plays, taken from the conformance data."""

    conversation_id: str
    turn_id: str
    question: str
    answer: str
    rewrite_arguments: dict[str, Any]
    """The model's memory_rewrite arguments, as the conformance data's first saved write."""
    saved_text: str
    """What the model must read back for that write (a fresh principal's empty block)."""
    empty_block_line: str
    """The last line of a fresh principal's prompt section."""


def scripted_turn() -> ScriptedTurn:
    """The first saved write of the conformance data and the section before it."""
    steps = {step["name"]: step for step in json.loads(CONFORMANCE.read_text())["steps"]}
    write = steps["saved: two lines added"]
    section = steps["a first turn's section: nothing remembered yet"]
    assert write["turn"] == section["turn"]
    return ScriptedTurn(
        conversation_id=write["turn"][0],
        turn_id=write["turn"][1],
        question="Call me Ana, and my Jira account is acct-7731.",
        answer="Noted, Ana.",
        rewrite_arguments=write["arguments"],
        saved_text=write["expect"]["text"],
        empty_block_line=section["expect"]["after_instructions"],
    )


@pytest.fixture
def turn() -> ScriptedTurn:
    """The scripted turn (see `scripted_turn`)."""
    return scripted_turn()


@dataclass
class Person:
    """A fresh person on the test server and their turn adapter."""

    api: Api
    who: tuple[tuple[str, str], ...]
    memory: MemoriaTurnAdapter


@pytest.fixture
def person(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Person]:
    """A real server (SQLite, trusted headers on loopback) and a fresh person's adapter."""
    with serving(server_settings("sqlite", request, tmp_path)) as api:
        who = tuple(api.who(f"p-{uuid.uuid4().hex[:8]}"))
        yield Person(api, who, MemoriaTurnAdapter(api.channel, who))


def check_turn(person: Person, turn: ScriptedTurn, *, renders: int) -> None:
    """The server saw the turn: the block holds the rewrite, the finished turn was accepted,
    and GetTurnInspection shows `renders` renders and the one write with its added lines."""
    assert person.memory.flush(timeout=30) == 0, "the finished turn was not accepted"
    stored = person.api.blocks.GetMemoryBlock(
        blocks_pb.GetMemoryBlockRequest(), metadata=person.who
    )
    assert stored.memory_block.text == turn.rewrite_arguments["text"]
    reference = block_pb.TurnReference(conversation_id=turn.conversation_id, turn_id=turn.turn_id)
    inspection = person.api.search.GetTurnInspection(
        search_pb.GetTurnInspectionRequest(turn=reference), metadata=person.who
    ).inspection
    assert len(inspection.renders) == renders
    assert inspection.renders[0].char_count == 0  # the first render: nothing remembered yet
    [write] = inspection.writes
    assert write.writer == block_pb.WRITER_MODEL
    assert list(write.removed_lines) == []
    assert list(write.added_lines) == turn.rewrite_arguments["text"].split("\n")
    assert inspection.failed_write_count == 0
