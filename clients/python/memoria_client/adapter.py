"""The turn adapter: what an agent loop calls around each model turn to give it Memoria.

Per turn, a loop (1) puts `system_prompt_section()` at the end of its system prompt, (2) sends
the tools of `load_tools(...)` with the request, (3) passes each tool call the model makes to
`execute(name, arguments)` and hands the returned `ToolResult.text` back to the model, and
(4) after the answer calls `finish_turn(...)`, which sends the turn to conversation search
without waiting and starts the next turn.

Everything the model reads is worded in `memoria_client.wording`. Malformed calls are answered
without calling the server, and after `max_failed_writes_per_turn` failed memory writes the
adapter refuses further writes in that turn without calling it either, so a model stuck in a
retry loop cannot hammer the service or the person's block.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime

import grpc
from google.protobuf import timestamp_pb2
from google.rpc import error_details_pb2
from grpc_status import rpc_status

from memoria.v1 import (
    conversation_search_service_pb2 as search_pb,
)
from memoria.v1 import (
    conversation_search_service_pb2_grpc as search_grpc,
)
from memoria.v1 import error_reason_pb2
from memoria.v1 import memory_block_pb2 as block_pb
from memoria.v1 import memory_block_service_pb2 as blocks_pb
from memoria.v1 import memory_block_service_pb2_grpc as blocks_grpc
from memoria_client import wording
from memoria_client.arguments import ArgumentError, parse_rewrite, parse_search
from memoria_client.tool_files import base_system_prompt

_log = logging.getLogger("memoria_client")

DEFAULT_TIMEOUT_SECONDS = 10.0


def _reason(value: error_reason_pb2.ErrorReason.ValueType) -> str:
    return error_reason_pb2.ErrorReason.Name(value)


BLOCK_TOO_LONG = _reason(error_reason_pb2.ERROR_REASON_BLOCK_TOO_LONG)
BLOCK_EMPTY = _reason(error_reason_pb2.ERROR_REASON_BLOCK_EMPTY)
MEMORY_DISABLED = _reason(error_reason_pb2.ERROR_REASON_MEMORY_DISABLED)
STORE_UNAVAILABLE = _reason(error_reason_pb2.ERROR_REASON_STORE_UNAVAILABLE)
STORAGE_FULL = _reason(error_reason_pb2.ERROR_REASON_STORAGE_FULL)
SECRET_DETECTED = _reason(error_reason_pb2.ERROR_REASON_SECRET_DETECTED)
WRITE_CONFLICT = _reason(error_reason_pb2.ERROR_REASON_WRITE_CONFLICT)
UNAUTHENTICATED = _reason(error_reason_pb2.ERROR_REASON_UNAUTHENTICATED)
INTERNAL = _reason(error_reason_pb2.ERROR_REASON_INTERNAL)


@dataclass(frozen=True)
class ToolResult:
    """What a tool call returns: `text` is exactly what the model reads.

    `is_error` marks a call that did not do what was asked (Anthropic's `tool_result.is_error`,
    MCP's `isError`); the text already says what to do next either way.
    """

    text: str
    is_error: bool


@dataclass(frozen=True)
class _Failure:
    """A failed call's status, decoded from its google.rpc details."""

    code: grpc.StatusCode
    reason: str
    message: str
    metadata: Mapping[str, str]
    violations: tuple[tuple[str, str], ...]


def _decode(error: grpc.RpcError) -> _Failure:
    code = error.code() if isinstance(error, grpc.Call) else grpc.StatusCode.UNKNOWN
    message = error.details() if isinstance(error, grpc.Call) else ""
    reason = ""
    metadata: dict[str, str] = {}
    violations: list[tuple[str, str]] = []
    status = rpc_status.from_call(error) if isinstance(error, grpc.Call) else None
    if status is not None:
        for detail in status.details:
            info = error_details_pb2.ErrorInfo()
            bad = error_details_pb2.BadRequest()
            if detail.Unpack(info):
                reason, metadata = info.reason, dict(info.metadata)
            elif detail.Unpack(bad):
                violations += [(v.field, v.description) for v in bad.field_violations]
    return _Failure(code, reason, message or "", metadata, tuple(violations))


def _int(value: str | None) -> int | None:
    try:
        return int(value) if value is not None else None
    except ValueError:
        return None


class MemoriaTurnAdapter:
    """Memoria's two tools and its prompt section for one person, turn after turn.

    `metadata` identifies the person on every call (`authorization: Bearer <jwt>`, or the
    trusted headers `x-memoria-tenant` / `x-memoria-principal` behind a mesh). One adapter
    serves one conversation at a time; its per-turn count of failed writes is guarded by a
    lock, so tool calls run in parallel threads are counted correctly.
    """

    def __init__(
        self,
        channel: grpc.Channel,
        metadata: Sequence[tuple[str, str]],
        *,
        max_failed_writes_per_turn: int = wording.DEFAULT_MAX_FAILED_WRITES,
        timeout: float | None = DEFAULT_TIMEOUT_SECONDS,
    ) -> None:
        if max_failed_writes_per_turn < 1:
            raise ValueError("max_failed_writes_per_turn must be at least 1")
        self._blocks = blocks_grpc.MemoryBlockServiceStub(channel)
        self._search = search_grpc.ConversationSearchServiceStub(channel)
        self._metadata = tuple(metadata)
        self._max_failed = max_failed_writes_per_turn
        self._timeout = timeout
        self._lock = threading.Lock()
        self._failed_writes = 0
        # Set while the last section could not show the block: a rewrite would then replace
        # a block the model has not seen, so writes are refused until a render succeeds.
        self._block_unseen = False
        self._pending: list[grpc.Future[search_pb.IndexTurnResponse]] = []

    # The prompt.

    def render_block(self) -> str:
        """The person's rendered memory block (header and text); empty when there is none."""
        response: blocks_pb.RenderMemoryBlockResponse = self._blocks.RenderMemoryBlock(
            blocks_pb.RenderMemoryBlockRequest(), metadata=self._metadata, timeout=self._timeout
        )
        return response.prompt_section

    def system_prompt_section(self) -> str:
        """The memory part of the system prompt: the base instructions, then the block, last.

        Place it at the very end of the system prompt: the block changes when the model writes,
        and whatever follows a change loses the provider's prompt cache. If the block cannot be
        loaded, the section says so and memory writes are refused (without a call) until a
        later section loads it: a whole rewrite over an unseen block would erase it.
        """
        try:
            block = self.render_block() or wording.EMPTY_BLOCK
            unseen = False
        except grpc.RpcError as error:
            failure = _decode(error)
            _log.warning("RenderMemoryBlock failed: %s %s", failure.code.name, failure.reason)
            block, unseen = wording.BLOCK_UNAVAILABLE, True
        with self._lock:
            self._block_unseen = unseen
        return f"{base_system_prompt()}\n\n{block}"

    # Turns.

    def start_turn(self) -> None:
        """Start a new turn: the count of failed memory writes starts again from zero."""
        with self._lock:
            self._failed_writes = 0

    def finish_turn(
        self,
        conversation_id: str,
        turn_id: str,
        question: str,
        answer: str,
        turn_time: datetime | None = None,
    ) -> None:
        """Send the finished turn to conversation search without waiting, and start the next.

        The call is made in the background (the server accepts it durably and indexes it
        shortly after); a failure is logged, as the answer has already been given. `flush`
        waits for the calls still in flight, for a process about to exit.
        """
        when = timestamp_pb2.Timestamp()
        when.FromDatetime(turn_time or datetime.now(UTC))
        request = search_pb.IndexTurnRequest(
            conversation_id=conversation_id,
            turn_id=turn_id,
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
            self._failed_writes = 0

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
        """Run one tool call of the model and word its outcome for the model."""
        if name == wording.REWRITE:
            return self._rewrite(arguments)
        if name == wording.SEARCH:
            return self._search_conversations(arguments)
        return ToolResult(wording.unknown_tool(name), is_error=True)

    def _rewrite(self, arguments: str | Mapping[str, object]) -> ToolResult:
        with self._lock:
            if self._failed_writes >= self._max_failed:
                return ToolResult(wording.refused_after_failures(self._max_failed), True)
            if self._block_unseen:
                return ToolResult(wording.REWRITE_BLOCK_UNSEEN, True)
        try:
            text = parse_rewrite(arguments).text
        except ArgumentError as error:
            return self._failed_write(wording.bad_arguments(wording.REWRITE, str(error)))
        try:
            response: blocks_pb.RewriteMemoryBlockResponse = self._blocks.RewriteMemoryBlock(
                blocks_pb.RewriteMemoryBlockRequest(text=text, writer=block_pb.WRITER_MODEL),
                metadata=self._metadata,
                timeout=self._timeout,
            )
        except grpc.RpcError as error:
            return self._failed_write(_rewrite_failure(_decode(error)))
        block = response.memory_block
        if not response.changed:
            return ToolResult(wording.unchanged(block.char_count, block.char_limit), False)
        return ToolResult(
            wording.saved(
                block.char_count, block.char_limit, response.removed_lines, response.added_lines
            ),
            is_error=False,
        )

    def _failed_write(self, text: str) -> ToolResult:
        with self._lock:
            self._failed_writes += 1
            failed = self._failed_writes
        return ToolResult(f"{text}\n{wording.failures_left(failed, self._max_failed)}", True)

    def _search_conversations(self, arguments: str | Mapping[str, object]) -> ToolResult:
        try:
            args = parse_search(arguments)
        except ArgumentError as error:
            return ToolResult(wording.bad_arguments(wording.SEARCH, str(error)), is_error=True)
        try:
            response: search_pb.SearchConversationsResponse = self._search.SearchConversations(
                search_pb.SearchConversationsRequest(
                    query=args.query, page_size=args.max_turns or 0
                ),
                metadata=self._metadata,
                timeout=self._timeout,
            )
        except grpc.RpcError as error:
            return _search_failure(_decode(error))
        if not response.hits:
            return ToolResult(wording.no_hits(args.query), is_error=False)
        parts = [wording.hits_header(len(response.hits), args.query)]
        for position, hit in enumerate(response.hits, start=1):
            when = hit.turn_time.ToDatetime(tzinfo=UTC).strftime("%Y-%m-%d %H:%M UTC")
            why = wording.why_matched(hit.keyword_rank, hit.semantic_rank)
            parts.append(
                wording.hit(position, hit.conversation_id, hit.turn_id, when, why, hit.text)
            )
        return ToolResult("\n\n".join(parts), is_error=False)


def _rewrite_failure(failure: _Failure) -> str:
    reason = failure.reason
    if reason == BLOCK_TOO_LONG:
        count = _int(failure.metadata.get("char_count"))
        limit = _int(failure.metadata.get("char_limit"))
        return wording.too_long(count, limit)
    if reason == BLOCK_EMPTY:
        return wording.BLOCK_EMPTY
    if reason == MEMORY_DISABLED:
        return wording.MEMORY_DISABLED
    if reason == STORE_UNAVAILABLE:
        return wording.STORE_UNAVAILABLE
    if reason == STORAGE_FULL:
        return wording.STORAGE_FULL
    if reason == WRITE_CONFLICT:
        return wording.WRITE_CONFLICT
    if reason == SECRET_DETECTED:
        return wording.secret_detected(failure.metadata.get("secret_types", ""), failure.violations)
    if reason == UNAUTHENTICATED or failure.code == grpc.StatusCode.UNAUTHENTICATED:
        return wording.REWRITE_UNAUTHENTICATED
    if reason == INTERNAL:
        return wording.internal(failure.metadata.get("trace_id", ""))
    if not reason and failure.code == grpc.StatusCode.RESOURCE_EXHAUSTED:
        # Past the server's message size limit (1 MiB): far past any block limit.
        return wording.too_long(None, None)
    if not reason and failure.code in (
        grpc.StatusCode.UNAVAILABLE,
        grpc.StatusCode.DEADLINE_EXCEEDED,
        grpc.StatusCode.CANCELLED,
    ):
        return wording.UNREACHABLE_WRITE
    return wording.rejected(reason or failure.code.name, failure.message, failure.violations)


def _search_failure(failure: _Failure) -> ToolResult:
    if failure.reason == UNAUTHENTICATED or failure.code == grpc.StatusCode.UNAUTHENTICATED:
        # The design's rule for an unconfirmed identity: no search runs, nothing comes back.
        return ToolResult(wording.SEARCH_UNAUTHENTICATED, is_error=False)
    if failure.reason == STORE_UNAVAILABLE or (
        not failure.reason
        and failure.code in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED)
    ):
        return ToolResult(wording.SEARCH_UNAVAILABLE, is_error=True)
    return ToolResult(
        wording.search_failed(
            failure.reason or failure.code.name, failure.message, failure.violations
        ),
        is_error=True,
    )


def _accepted(future: grpc.Future[search_pb.IndexTurnResponse]) -> bool:
    return future.done() and not future.cancelled() and future.exception() is None


def _log_index_failure(future: grpc.Future[search_pb.IndexTurnResponse]) -> None:
    if future.cancelled():
        _log.warning("IndexTurn was cancelled before the turn was accepted")
        return
    error = future.exception()
    if error is not None:
        failure = _decode(error) if isinstance(error, grpc.RpcError) else None
        _log.warning(
            "IndexTurn failed: %s %s",
            failure.code.name if failure else type(error).__name__,
            failure.reason if failure else "",
        )
