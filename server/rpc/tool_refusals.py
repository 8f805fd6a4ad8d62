"""The words the model reads when ExecuteToolCall fails as a call, in the error status.

A tool call's outcomes are answered OK with the model's words (server/domain/tool_calls.py),
except an unconfirmed identity (no store is touched, so no servicer runs) and an unexpected
server error. For those two the status carries a `google.rpc.LocalizedMessage` with the words,
so an adapter in any language hands the model the same text without a copy of it. The backend's
own mistakes (no turn, invalid ids) get none: they are not the model's to read.
"""

from __future__ import annotations

from typing import Any

from memoria.v1 import model_tool_service_pb2 as pb
from server.domain.errors import ErrorReason, Internal, MemoriaError
from server.domain.tool_calls import internal_words, unauthenticated_words

EXECUTE_TOOL_CALL = "/memoria.v1.ModelToolService/ExecuteToolCall"


def refusal_words(method: str, request: Any, error: MemoriaError) -> str | None:
    """The model's words for `error` of a call to `method`, or None when it has none."""
    if method != EXECUTE_TOOL_CALL or not isinstance(request, pb.ExecuteToolCallRequest):
        return None
    if error.reason is ErrorReason.UNAUTHENTICATED:
        return unauthenticated_words(request.tool_name)
    if error.reason is ErrorReason.INTERNAL and isinstance(error.details, Internal):
        return internal_words(error.details.trace_id)
    return None
