"""The turn adapter: what an agent loop calls around each model turn to give it Memoria.

A thin layer over ModelToolService, the same small API as the Go and TypeScript adapters
(clients/go, clients/ts). Per turn, a loop (1) calls `start_turn(conversation_id, turn_id)`,
(2) puts `prompt_section()` at the end of its system prompt, (3) sends `tools(shape)` with the
request, (4) passes each tool call the model makes to `execute(name, arguments)` and hands
the returned `ToolResult.text` back to the model, and (5) after the answer calls
`finish_turn(question, answer)`, which sends the turn to conversation search without waiting.

Every word the model reads comes from the server: the checks, the wording and the per-turn cap
of failed writes live there (ExecuteToolCall), and the words for a server that cannot be
reached are fetched with the tools (GetModelTools) when the adapter is made. Every render,
search and write carries the turn, so GetTurnInspection shows what each turn read and wrote.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import grpc
from google.protobuf import timestamp_pb2
from google.rpc import error_details_pb2
from grpc_status import rpc_status

from memoria.v1 import conversation_search_service_pb2 as search_pb
from memoria.v1 import conversation_search_service_pb2_grpc as search_grpc
from memoria.v1 import memory_block_pb2 as block_pb
from memoria.v1 import model_tool_service_pb2 as tools_pb
from memoria.v1 import model_tool_service_pb2_grpc as tools_grpc
from memoria_client.tool_files import Shape, render

_log = logging.getLogger("memoria_client")

DEFAULT_TIMEOUT_SECONDS = 10.0
REWRITE = "memory_rewrite"


@dataclass(frozen=True)
class ToolResult:
    """What a tool call returns: `text` is exactly what the model reads.

    `is_error` marks a call that did not do what was asked (Anthropic's `tool_result.is_error`,
    MCP's `isError`); the text already says what to do next either way.
    """

    text: str
    is_error: bool


class MemoriaTurnAdapter:
    """Memoria's tools and prompt section for one person's conversation, turn after turn.

    `metadata` identifies the person on every call (`authorization: Bearer <jwt>`, or the
    trusted headers `x-memoria-tenant` / `x-memoria-principal` behind a mesh). Making an
    adapter fetches the model's tools (one GetModelTools call, which fails like any call when
    the server is unreachable or the identity is not confirmed); `for_identity` makes another
    person's adapter from the same fetch. The current turn is guarded by a lock, so tool calls
    run in parallel threads all carry it.
    """

    def __init__(
        self,
        channel: grpc.Channel,
        metadata: Sequence[tuple[str, str]],
        *,
        timeout: float | None = DEFAULT_TIMEOUT_SECONDS,
        model_tools: tools_pb.GetModelToolsResponse | None = None,
    ) -> None:
        self._channel = channel
        self._tools = tools_grpc.ModelToolServiceStub(channel)
        self._search = search_grpc.ConversationSearchServiceStub(channel)
        self._metadata = tuple(metadata)
        self._timeout = timeout
        if model_tools is None:
            model_tools = self._tools.GetModelTools(
                tools_pb.GetModelToolsRequest(), metadata=self._metadata, timeout=timeout
            )
        self.model_tools: tools_pb.GetModelToolsResponse = model_tools
        self._unreachable = {t.name: t.unreachable_text for t in model_tools.tools}
        self._lock = threading.Lock()
        self._turn: block_pb.TurnReference | None = None
        # Set while this turn's section could not show the block: a rewrite would replace a
        # block the model has not seen, so the adapter refuses it without a call.
        self._block_unseen = False
        self._pending: list[grpc.Future[search_pb.IndexTurnResponse]] = []

    def for_identity(self, metadata: Sequence[tuple[str, str]]) -> MemoriaTurnAdapter:
        """An adapter for another person (or conversation) sharing this one's fetched tools."""
        return MemoriaTurnAdapter(
            self._channel, metadata, timeout=self._timeout, model_tools=self.model_tools
        )

    def tools(self, shape: Shape) -> list[dict[str, Any]]:
        """The `tools` list to send to a provider: "openai_chat_completions",
        "openai_responses" or "anthropic_messages"."""
        source = [
            {
                "name": t.name,
                "description": t.description,
                "parameters": json.loads(t.parameters_json_schema),
            }
            for t in self.model_tools.tools
        ]
        return render(shape, source)

    # Turns.

    def start_turn(self, conversation_id: str, turn_id: str) -> None:
        """Start a turn: every render, tool call and the finished turn carry these ids."""
        with self._lock:
            self._turn = block_pb.TurnReference(conversation_id=conversation_id, turn_id=turn_id)
            self._block_unseen = False

    def _current(self) -> block_pb.TurnReference:
        with self._lock:
            if self._turn is None:
                raise RuntimeError("no turn: call start_turn(conversation_id, turn_id) first")
            return self._turn

    def prompt_section(self) -> str:
        """The memory part of the system prompt: the instructions, then the block, last.

        Place it at the very end of the system prompt: the block changes when the model writes,
        and whatever follows a change loses the provider's prompt cache. If the section cannot
        be rendered, it is the server's words for that, and memory writes are refused (without
        a call) for the rest of the turn: a whole rewrite over an unseen block would erase it.
        """
        turn = self._current()
        try:
            response: tools_pb.RenderPromptSectionResponse = self._tools.RenderPromptSection(
                tools_pb.RenderPromptSectionRequest(turn=turn),
                metadata=self._metadata,
                timeout=self._timeout,
            )
            section, unseen = response.prompt_section, False
        except grpc.RpcError as error:
            _log.warning("RenderPromptSection failed: %s", _code(error).name)
            section, unseen = self.model_tools.unavailable_prompt_section, True
        with self._lock:
            self._block_unseen = unseen
        return section

    system_prompt_section = prompt_section
    """The name of `prompt_section` before ModelToolService (kept for existing callers)."""

    def finish_turn(self, question: str, answer: str, turn_time: datetime | None = None) -> None:
        """Send the finished turn to conversation search without waiting; the turn ends.

        The call is made in the background (the server accepts it durably and indexes it
        shortly after); a failure is logged, as the answer has already been given. `flush`
        waits for the calls still in flight, for a process about to exit.
        """
        turn = self._current()
        when = timestamp_pb2.Timestamp()
        when.FromDatetime(turn_time or datetime.now(UTC))
        request = search_pb.IndexTurnRequest(
            conversation_id=turn.conversation_id,
            turn_id=turn.turn_id,
            question=question,
            answer=answer,
            turn_time=when,
        )
        future = self._search.IndexTurn.future(
            request, metadata=self._metadata, timeout=self._timeout
        )
        future.add_done_callback(_log_index_failure)
        with self._lock:
            # Accepted turns need no more attention; failed ones stay for `flush` to count.
            self._pending = [f for f in self._pending if not _accepted(f)] + [future]
            self._turn = None

    def flush(self, timeout: float | None = None) -> int:
        """Wait (up to `timeout` seconds in all) for the turns sent by `finish_turn`.

        Returns how many of them were not accepted (failed, or still unanswered at the
        deadline), counting each turn once.
        """
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._lock:
            pending, self._pending = self._pending, []
        failed = 0
        for future in pending:
            left = None if deadline is None else max(0.0, deadline - time.monotonic())
            try:
                future.result(timeout=left)
            except (grpc.RpcError, grpc.FutureTimeoutError, grpc.FutureCancelledError):
                failed += 1
        return failed

    # Tool calls.

    def execute(self, name: str, arguments: str | Mapping[str, object]) -> ToolResult:
        """Run one tool call of the model as it produced it; `text` is what the model reads.

        `arguments` is the JSON text (OpenAI) or the object (Anthropic, MCP) the provider gave.
        Raises grpc.RpcError only for the backend's own mistakes (INVALID_ARGUMENT: invalid
        turn ids), and RuntimeError without a started turn.
        """
        turn = self._current()
        with self._lock:
            unseen = self._block_unseen
        if name == REWRITE and unseen:
            return ToolResult(self.model_tools.rewrite_refused_unseen_text, is_error=True)
        if not isinstance(arguments, str):
            arguments = json.dumps(arguments, separators=(",", ":"), ensure_ascii=False)
        try:
            response: tools_pb.ExecuteToolCallResponse = self._tools.ExecuteToolCall(
                tools_pb.ExecuteToolCallRequest(
                    turn=turn, tool_name=name, arguments_json=arguments
                ),
                metadata=self._metadata,
                timeout=self._timeout,
            )
        except grpc.RpcError as error:
            return self._failed_call(name, error)
        return ToolResult(response.text, response.is_error)

    def _failed_call(self, name: str, error: grpc.RpcError) -> ToolResult:
        """The model's words for a call that got no answer to read (see the proto)."""
        words = _localized_message(error)
        if words is not None:  # an unconfirmed identity or a server error: the server's words
            return ToolResult(words, is_error=True)
        code = _code(error)
        if code == grpc.StatusCode.INVALID_ARGUMENT or name not in self._unreachable:
            raise error  # the backend's own mistake, not the model's to read
        _log.warning("ExecuteToolCall %s got no answer: %s", name, code.name)
        return ToolResult(self._unreachable[name], is_error=True)


def _code(error: grpc.RpcError) -> grpc.StatusCode:
    return error.code() if isinstance(error, grpc.Call) else grpc.StatusCode.UNKNOWN


def _localized_message(error: grpc.RpcError) -> str | None:
    status = rpc_status.from_call(error) if isinstance(error, grpc.Call) else None
    if status is None:
        return None
    for detail in status.details:
        message = error_details_pb2.LocalizedMessage()
        if detail.Unpack(message):
            return str(message.message)
    return None


def _accepted(future: grpc.Future[search_pb.IndexTurnResponse]) -> bool:
    return future.done() and not future.cancelled() and future.exception() is None


def _log_index_failure(future: grpc.Future[search_pb.IndexTurnResponse]) -> None:
    if future.cancelled():
        _log.warning("IndexTurn was cancelled before the turn was accepted")
        return
    error = future.exception()
    if error is not None:
        name = _code(error).name if isinstance(error, grpc.RpcError) else type(error).__name__
        _log.warning("IndexTurn failed: %s", name)
