"""The ModelToolService servicer: the model's tools, prompt section and tool calls.

Converts messages and calls the domain (server/domain/tool_calls.py, which words every
outcome in server/domain/model_words.py). The words an unconfirmed identity or an unexpected
error gets, which no servicer is reached to answer, are added to the error status by the
interceptor (server/rpc/tool_refusals.py).
"""

from __future__ import annotations

import grpc

from memoria.v1 import model_tool_service_pb2 as pb
from memoria.v1 import model_tool_service_pb2_grpc as pb_grpc
from server.domain import model_words
from server.domain.tool_calls import ToolCalls, ToolOutcome, reason_name
from server.rpc.convert import turn_ref_of
from server.rpc.interceptor import current_identity

_OUTCOMES: dict[ToolOutcome, pb.ToolCallOutcome.ValueType] = {
    ToolOutcome.MEMORY_SAVED: pb.TOOL_CALL_OUTCOME_MEMORY_SAVED,
    ToolOutcome.MEMORY_UNCHANGED: pb.TOOL_CALL_OUTCOME_MEMORY_UNCHANGED,
    ToolOutcome.SEARCH_HITS: pb.TOOL_CALL_OUTCOME_SEARCH_HITS,
    ToolOutcome.SEARCH_NO_HITS: pb.TOOL_CALL_OUTCOME_SEARCH_NO_HITS,
    ToolOutcome.INVALID_ARGUMENTS: pb.TOOL_CALL_OUTCOME_INVALID_ARGUMENTS,
    ToolOutcome.UNKNOWN_TOOL: pb.TOOL_CALL_OUTCOME_UNKNOWN_TOOL,
    ToolOutcome.REFUSED: pb.TOOL_CALL_OUTCOME_REFUSED,
    ToolOutcome.FAILED_WRITES_EXHAUSTED: pb.TOOL_CALL_OUTCOME_FAILED_WRITES_EXHAUSTED,
}

MODEL_TOOLS = pb.GetModelToolsResponse(
    tools=[
        pb.ModelTool(
            name=tool.name,
            description=tool.description,
            parameters_json_schema=tool.parameters_json(),
            unreachable_text=model_words.UNREACHABLE_TEXT[tool.name],
        )
        for tool in model_words.TOOLS
    ],
    base_instructions=model_words.BASE_INSTRUCTIONS,
    unavailable_prompt_section=model_words.UNAVAILABLE_PROMPT_SECTION,
    rewrite_refused_unseen_text=model_words.REWRITE_BLOCK_UNSEEN,
)
"""GetModelTools' answer: the same for every caller and every call, built once (the tests'
scripted server answers with it too)."""


class ModelToolServicer(pb_grpc.ModelToolServiceServicer):
    """memoria.v1.ModelToolService."""

    def __init__(self, calls: ToolCalls) -> None:
        self._calls = calls

    def GetModelTools(
        self, request: pb.GetModelToolsRequest, context: grpc.ServicerContext
    ) -> pb.GetModelToolsResponse:
        return MODEL_TOOLS

    def RenderPromptSection(
        self, request: pb.RenderPromptSectionRequest, context: grpc.ServicerContext
    ) -> pb.RenderPromptSectionResponse:
        section = self._calls.prompt_section(current_identity(), turn_ref_of(request))
        return pb.RenderPromptSectionResponse(
            prompt_section=section.text,
            etag=section.etag,
            char_count=section.char_count,
            section_char_count=section.section_char_count,
            char_limit=section.char_limit,
        )

    def ExecuteToolCall(
        self, request: pb.ExecuteToolCallRequest, context: grpc.ServicerContext
    ) -> pb.ExecuteToolCallResponse:
        result = self._calls.execute(
            current_identity(), turn_ref_of(request), request.tool_name, request.arguments_json
        )
        return pb.ExecuteToolCallResponse(
            text=result.text,
            is_error=result.is_error,
            outcome=_OUTCOMES[result.outcome],
            error_reason=reason_name(result.error_reason) if result.error_reason else "",
            failed_write_count=result.failed_write_count,
        )
