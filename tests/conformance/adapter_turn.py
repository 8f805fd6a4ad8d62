"""Plays tests/conformance/model_turn.json through the Python turn adapter (MemoriaTurnAdapter).

The same steps as the raw runner (model_turn.py), played the way a backend plays them: the
tools come from `tools(shape)`, the section from `start_turn` + `prompt_section()`, each tool
call through `execute(name, arguments)`, and the model must read exactly the data's text. What
the adapter API does not expose (a response's outcome and failed-write count, the section's
char_count) the raw runner checks. The steps that are not the model's side (IndexTurn with
`wait`, UpdateMemorySettings, GetTurnInspection) use the raw stubs, as in model_turn.py. The
Go and TypeScript adapters play the same steps the same way (clients/go, clients/ts):

- an `"identity": "none"` call goes through an adapter of no identity (sharing the fetched
  tools): the model reads the status's LocalizedMessage as an error;
- an `"omit_turn"` call goes through an adapter with no started turn: the adapter refuses it
  (the backend's mistake) without a call;
- at the end the adapter finishes its turn (IndexTurn without waiting), which must be accepted.
"""

from __future__ import annotations

import json
from typing import Any

import grpc

from memoria_client import SHAPES, MemoriaTurnAdapter
from tests.conformance.model_turn import ROOT, Runner


def _source(tools: list[dict[str, Any]], shape: str) -> list[dict[str, Any]]:
    """A provider shape's tools back as {name, description, parameters}."""
    if shape == "openai_chat_completions":
        tools = [t["function"] for t in tools]
    schema = "input_schema" if shape == "anthropic_messages" else "parameters"
    return [
        {"name": t["name"], "description": t["description"], "parameters": t[schema]} for t in tools
    ]


class AdapterRunner(Runner):
    """Runner whose model-side steps go through one MemoriaTurnAdapter."""

    def __init__(self, channel: grpc.Channel, identity: list[tuple[str, str]]) -> None:
        super().__init__(channel, identity)
        self.adapter = MemoriaTurnAdapter(channel, identity, timeout=60)
        self._turn: tuple[str, str] | None = None

    def run(self, data: dict[str, Any]) -> list[Any]:
        mismatches = super().run(data)
        self.adapter.finish_turn("The last question.", "The last answer.")
        self._check({"name": "finish_turn"}, "turns not accepted", 0, self.adapter.flush(60))
        return mismatches

    def _in_turn(self, step: dict[str, Any]) -> None:
        turn = (step["turn"][0], step["turn"][1])
        if turn != self._turn:
            self.adapter.start_turn(*turn)
            self._turn = turn

    def _GetModelTools(self, step: dict[str, Any], data: dict[str, Any]) -> None:
        source = json.loads((ROOT / data["tools_file"]).read_text("utf-8"))["tools"]
        for shape in SHAPES:
            self._check(step, shape, source, _source(self.adapter.tools(shape), shape))

    def _RenderPromptSection(self, step: dict[str, Any], data: dict[str, Any]) -> None:
        self._in_turn(step)
        section = f"{self._instructions}\n\n{step['expect']['after_instructions']}"
        self._check(step, "prompt_section", section, self.adapter.prompt_section())

    def _ExecuteToolCall(self, step: dict[str, Any], data: dict[str, Any]) -> None:
        expect = step["expect"]
        arguments = step["arguments_json"] if "arguments_json" in step else step["arguments"]
        if step.get("omit_turn"):
            try:
                self.adapter.for_identity(self._identity).execute(step["tool_name"], arguments)
            except RuntimeError:
                return
            self._check(step, "a call without a turn", "refused", "made")
            return
        adapter = self.adapter
        if step.get("identity") == "none":
            adapter = self.adapter.for_identity([])
            adapter.start_turn(*step["turn"])
            expect = {"text": expect["localized_message"], "is_error": True}
        else:
            self._in_turn(step)
        result = adapter.execute(step["tool_name"], arguments)
        self._check(step, "text", expect["text"], result.text)
        self._check(step, "is_error", expect["is_error"], result.is_error)
