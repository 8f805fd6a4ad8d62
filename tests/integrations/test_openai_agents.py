"""The OpenAI Agents SDK integration (integrations/openai-agents) against a real server.

The SDK's own seam for tests is its `Model` interface (its test suite plays scripted turns
through a FakeModel): `ScriptedModel` below is that, answering each call from what it was given.
It asks for memory_rewrite, reads the function call's output, and answers; the test checks that
the instructions ended with the memory section, that the tool's output was the server's words,
and what the server recorded for the turn.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from agents import Agent, ModelResponse, ModelSettings, Runner, Usage, set_tracing_disabled
from agents.models.interface import Model
from openai.types.responses import (
    ResponseFunctionToolCall,
    ResponseOutputMessage,
    ResponseOutputText,
)

from memoria_client import MemoriaTurnAdapter
from memoria_openai_agents import memoria_instructions, memoria_tools
from tests.integrations.conftest import Person, ScriptedTurn, check_turn

BASE = "You are a helpful assistant."


@dataclass
class Seen:
    """What the model was given on one call."""

    instructions: str | None
    tool_outputs: list[str]
    tools: list[str]


@dataclass
class ScriptedModel(Model):
    """A model that writes the turn's block on its first call and answers on its second."""

    turn: ScriptedTurn
    seen: list[Seen] = field(default_factory=list)

    async def get_response(
        self,
        system_instructions: str | None,
        input: Any,
        model_settings: ModelSettings,
        tools: list[Any],
        *args: Any,
        **kwargs: Any,
    ) -> ModelResponse:
        items = [] if isinstance(input, str) else list(input)
        outputs = [str(i["output"]) for i in items if i.get("type") == "function_call_output"]
        self.seen.append(Seen(system_instructions, outputs, [t.name for t in tools]))
        if not outputs:
            call = ResponseFunctionToolCall(
                type="function_call",
                id="fc-1",
                call_id="call-1",
                name="memory_rewrite",
                arguments=json.dumps(self.turn.rewrite_arguments),
                status="completed",
            )
            return ModelResponse(output=[call], usage=Usage(), response_id=None)
        text = ResponseOutputText(type="output_text", text=self.turn.answer, annotations=[])
        message = ResponseOutputMessage(
            type="message", id="msg-1", role="assistant", status="completed", content=[text]
        )
        return ModelResponse(output=[message], usage=Usage(), response_id=None)

    def stream_response(self, *args: Any, **kwargs: Any) -> AsyncIterator[Any]:
        raise NotImplementedError("this test runs the agent without streaming")


async def answer(
    memory: MemoriaTurnAdapter, model: Model, conversation_id: str, turn_id: str, question: str
) -> str:
    """One turn of an agent, as integrations/openai-agents/README.md wires it."""
    # README wiring: begin
    agent = Agent(
        name="assistant",
        instructions=memoria_instructions("You are a helpful assistant.", memory),  # section last
        tools=memoria_tools(memory),
        model=model,
    )
    memory.start_turn(conversation_id, turn_id)
    result = await Runner.run(agent, question)
    memory.finish_turn(question, str(result.final_output))
    # README wiring: end
    return str(result.final_output)


def test_an_agent_saves_the_block_and_reads_the_servers_words(
    person: Person, turn: ScriptedTurn
) -> None:
    model = ScriptedModel(turn)
    set_tracing_disabled(True)  # the SDK's traces would go to OpenAI's servers
    try:
        # A thread of its own: in the whole suite the browser tests' Playwright (sync API)
        # keeps an event loop running on the main thread, where asyncio.run() is refused.
        with ThreadPoolExecutor(max_workers=1) as thread:
            final = thread.submit(
                asyncio.run,
                answer(person.memory, model, turn.conversation_id, turn.turn_id, turn.question),
            ).result()
    finally:
        set_tracing_disabled(False)

    assert final == turn.answer
    first, second = model.seen
    assert first.tools == ["memory_rewrite", "conversation_search"]
    assert first.instructions is not None
    assert first.instructions.startswith(BASE + "\n\n")
    assert first.instructions.endswith(turn.empty_block_line)
    assert second.tool_outputs == [turn.saved_text]
    # Rendered again for the second call: the section ends with the saved block.
    assert second.instructions is not None
    assert second.instructions.endswith(turn.rewrite_arguments["text"])
    check_turn(person, turn, renders=2)
