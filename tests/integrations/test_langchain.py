"""The LangChain tools (integrations/langchain) in a LangGraph agent, against a real server.

The model is LangChain's own test model, GenericFakeChatModel (scripted replies; its
`bind_tools` is the one addition a tool-calling graph needs), and a callback handler records
what it was given. It asks for memory_rewrite, then answers after LangGraph's ToolNode ran the
tool; the test checks the system prompt's end, that the ToolMessage is the server's words, and
what the server recorded for the turn.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from langchain_core.callbacks import BaseCallbackHandler
from langchain_core.language_models import GenericFakeChatModel
from langchain_core.messages import AIMessage, BaseMessage, HumanMessage, SystemMessage, ToolMessage
from langgraph.graph import START, MessagesState, StateGraph
from langgraph.prebuilt import ToolNode, tools_condition

from memoria_client import MemoriaTurnAdapter
from memoria_langchain import memoria_tools
from tests.integrations.conftest import CONFORMANCE, Person, ScriptedTurn, check_turn

BASE = "You are a helpful assistant."


class ToolCallingFakeModel(GenericFakeChatModel):
    """GenericFakeChatModel that accepts tools (it replies from its script either way)."""

    def bind_tools(self, tools: Sequence[Any], **kwargs: Any) -> ToolCallingFakeModel:
        return self


class Recorder(BaseCallbackHandler):
    """The messages each model call was given."""

    def __init__(self) -> None:
        self.calls: list[list[BaseMessage]] = []

    def on_chat_model_start(
        self, serialized: dict[str, Any], messages: list[list[BaseMessage]], **kwargs: Any
    ) -> None:
        self.calls.extend(messages)


def answer_turn(
    memory: MemoriaTurnAdapter,
    llm: ToolCallingFakeModel,
    conversation_id: str,
    turn_id: str,
    question: str,
) -> str:
    """One turn of a LangGraph tool loop, as integrations/langchain/README.md wires it."""
    # README wiring: begin
    tools = memoria_tools(memory)
    model = llm.bind_tools(tools)

    def agent(state: MessagesState) -> MessagesState:
        system = SystemMessage("You are a helpful assistant.\n\n" + memory.prompt_section())
        return {"messages": [model.invoke([system, *state["messages"]])]}

    graph = StateGraph(MessagesState)
    graph.add_node("agent", agent)
    graph.add_node("tools", ToolNode(tools))
    graph.add_edge(START, "agent")
    graph.add_conditional_edges("agent", tools_condition)
    graph.add_edge("tools", "agent")
    app = graph.compile()

    memory.start_turn(conversation_id, turn_id)
    answer = app.invoke({"messages": [HumanMessage(question)]})["messages"][-1].text
    memory.finish_turn(question, answer)
    # README wiring: end
    return str(answer)


def test_a_langgraph_agent_saves_the_block_and_reads_the_servers_words(
    person: Person, turn: ScriptedTurn
) -> None:
    call = {"name": "memory_rewrite", "args": turn.rewrite_arguments, "id": "call-1"}
    script = iter([AIMessage(content="", tool_calls=[call]), AIMessage(content=turn.answer)])
    recorder = Recorder()
    llm = ToolCallingFakeModel(messages=script, callbacks=[recorder])
    answer = answer_turn(person.memory, llm, turn.conversation_id, turn.turn_id, turn.question)

    assert answer == turn.answer
    first, second = recorder.calls
    assert isinstance(first[0], SystemMessage)
    assert str(first[0].content).startswith(BASE + "\n\n")
    assert str(first[0].content).endswith(turn.empty_block_line)
    [result] = [m for m in second if isinstance(m, ToolMessage)]
    assert (result.content, result.status, result.tool_call_id) == (
        turn.saved_text,
        "success",
        "call-1",
    )
    assert str(second[0].content).endswith(turn.rewrite_arguments["text"])
    check_turn(person, turn, renders=2)


def test_a_call_the_server_refuses_is_an_error_tool_message(person: Person) -> None:
    steps = {s["name"]: s for s in json.loads(Path(CONFORMANCE).read_text())["steps"]}
    step = steps["search: an extra argument"]
    [search] = [t for t in memoria_tools(person.memory) if t.name == step["tool_name"]]
    person.memory.start_turn(*step["turn"])
    message = search.invoke(
        {"type": "tool_call", "name": search.name, "args": step["arguments"], "id": "call-2"}
    )
    assert isinstance(message, ToolMessage)
    assert (message.content, message.status) == (step["expect"]["text"], "error")
