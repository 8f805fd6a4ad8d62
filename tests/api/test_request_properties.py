"""Request validation as properties, against a running server: arbitrary ids and strings in
every request field answer OK or one of the documented reasons, never INTERNAL or UNKNOWN.

Hypothesis draws the values (any Unicode text, including control, invisible and non-ASCII
characters; any integer in range; any identity a gRPC client can send as a header); each
answer must be a clear status whose ErrorInfo reason maps to the code received.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

import grpc
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from memoria.v1 import audit_service_pb2 as audit_pb
from memoria.v1 import conversation_search_service_pb2 as search_pb
from memoria.v1 import memory_block_pb2 as block_pb
from memoria.v1 import memory_block_service_pb2 as blocks_pb
from server.domain.errors import ErrorReason
from server.rpc.errors import STATUS_OF
from tests.api.conftest import Api, Metadata, error_info, server_settings, serving

DOCUMENTED = frozenset(
    {
        ErrorReason.UNAUTHENTICATED,
        ErrorReason.PERMISSION_DENIED,
        ErrorReason.INVALID_ARGUMENT,
        ErrorReason.INVALID_PAGE_TOKEN,
        ErrorReason.BLOCK_EMPTY,
        ErrorReason.BLOCK_TOO_LONG,
        ErrorReason.ETAG_MISMATCH,
        ErrorReason.MEMORY_DISABLED,
        ErrorReason.CONVERSATION_DELETED,
        ErrorReason.SECRET_DETECTED,
    }
)
"""What a caller's request can be refused with (the store-side reasons are not its doing)."""

PROPERTY_SETTINGS = settings(max_examples=60, deadline=None)  # each example calls a server

texts = st.text(max_size=300)
ids = st.text(max_size=300) | st.text(st.characters(min_codepoint=0x20, max_codepoint=0x7E))
int32s = st.integers(min_value=-(2**31), max_value=2**31 - 1)
header_values = st.text(st.characters(min_codepoint=0x20, max_codepoint=0x7E), max_size=300)


@pytest.fixture(scope="module")
def props_api(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Api]:
    """One embedded server for every example of the module."""
    with serving(server_settings("sqlite", request, tmp_path_factory.mktemp("props"))) as api:
        yield api


def clear_status(call: Callable[[], object]) -> str:
    """Run `call`; "OK" or the ErrorInfo reason of a documented refusal (else the test fails)."""
    try:
        call()
    except grpc.RpcError as error:
        assert isinstance(error, grpc.Call)
        code = error.code()
        assert code not in (grpc.StatusCode.INTERNAL, grpc.StatusCode.UNKNOWN), error.details()
        info = error_info(error)
        reason = ErrorReason[info.reason.removeprefix("ERROR_REASON_")]
        assert reason in DOCUMENTED, info.reason
        assert STATUS_OF[reason] is code
        return info.reason
    return "OK"


@PROPERTY_SETTINGS
@given(tenant=header_values, principal=header_values, roles=header_values)
def test_any_identity_headers(props_api: Api, tenant: str, principal: str, roles: str) -> None:
    md: Metadata = (("x-memoria-tenant", tenant), ("x-memoria-principal", principal))
    if roles:
        md += (("x-memoria-roles", roles),)
    reason = clear_status(
        lambda: props_api.blocks.GetMemoryBlock(blocks_pb.GetMemoryBlockRequest(), metadata=md)
    )
    valid = all(v and v == v.strip(" ") for v in (tenant, principal))
    assert reason == ("OK" if valid else "ERROR_REASON_UNAUTHENTICATED")


@PROPERTY_SETTINGS
@given(
    conversation_id=ids,
    turn_id=ids,
    question=texts,
    answer=texts,
    seconds=st.integers(min_value=-(2**40), max_value=2**40),
)
def test_any_turn(
    props_api: Api, conversation_id: str, turn_id: str, question: str, answer: str, seconds: int
) -> None:
    request = search_pb.IndexTurnRequest(
        conversation_id=conversation_id, turn_id=turn_id, question=question, answer=answer
    )
    request.turn_time.seconds = seconds
    clear_status(lambda: props_api.search.IndexTurn(request, metadata=props_api.who("props")))


@PROPERTY_SETTINGS
@given(query=texts, page_size=int32s, conversation_id=ids)
def test_any_search_and_conversation_delete(
    props_api: Api, query: str, page_size: int, conversation_id: str
) -> None:
    who = props_api.who("props")
    clear_status(
        lambda: props_api.search.SearchConversations(
            search_pb.SearchConversationsRequest(query=query, page_size=page_size), metadata=who
        )
    )
    clear_status(
        lambda: props_api.search.DeleteConversation(
            search_pb.DeleteConversationRequest(conversation_id=conversation_id), metadata=who
        )
    )


@PROPERTY_SETTINGS
@given(
    conversation_id=ids,
    start=st.none() | st.integers(min_value=-(2**40), max_value=2**40),
    end=st.none() | st.integers(min_value=-(2**40), max_value=2**40),
    nanos=st.integers(min_value=-(2**31), max_value=2**31 - 1),
)
def test_any_search_bounds(
    props_api: Api, conversation_id: str, start: int | None, end: int | None, nanos: int
) -> None:
    request = search_pb.SearchConversationsRequest(query="q", conversation_id=conversation_id)
    if start is not None:
        request.start_time.seconds = start
        request.start_time.nanos = nanos
    if end is not None:
        request.end_time.seconds = end
    who = props_api.who("props")
    clear_status(lambda: props_api.search.SearchConversations(request, metadata=who))


@PROPERTY_SETTINGS
@given(principal_id=ids, admin=st.booleans())
def test_any_erasure_target(props_api: Api, principal_id: str, admin: bool) -> None:
    who = props_api.who("props-admin", roles="memoria-admin" if admin else "")
    reason = clear_status(
        lambda: props_api.search.ErasePrincipalData(
            search_pb.ErasePrincipalDataRequest(principal_id=principal_id), metadata=who
        )
    )
    valid = principal_id == "" or (
        0 < len(principal_id) <= 256
        and all(0x20 <= ord(c) <= 0x7E for c in principal_id)
        and principal_id == principal_id.strip(" ")
    )
    if not valid:
        assert reason == "ERROR_REASON_INVALID_ARGUMENT"
    elif principal_id in ("", "props-admin") or admin:
        assert reason == "OK"
    else:
        assert reason == "ERROR_REASON_PERMISSION_DENIED"


@PROPERTY_SETTINGS
@given(
    principal_id=ids,
    page_token=st.text(max_size=80),
    page_size=int32s,
    actions=st.lists(int32s, max_size=3),
)
def test_any_audit_listing(
    props_api: Api, principal_id: str, page_token: str, page_size: int, actions: list[int]
) -> None:
    request = audit_pb.ListAuditEventsRequest(
        principal_id=principal_id, page_token=page_token, page_size=page_size
    )
    request.actions.extend(actions)  # type: ignore[arg-type]
    who = props_api.who("props-admin", roles="memoria-admin")
    reason = clear_status(lambda: props_api.audit.ListAuditEvents(request, metadata=who))
    if page_token and reason == "OK":
        raise AssertionError("a page token not issued by the server was accepted")


@PROPERTY_SETTINGS
@given(text=st.text(max_size=600), writer=int32s, etag=st.none() | st.text(max_size=20))
def test_any_rewrite(props_api: Api, text: str, writer: int, etag: str | None) -> None:
    request = blocks_pb.RewriteMemoryBlockRequest(text=text, writer=writer)  # type: ignore[arg-type]
    if etag is not None:
        request.etag = etag
    reason = clear_status(
        lambda: props_api.blocks.RewriteMemoryBlock(request, metadata=props_api.who("props"))
    )
    if writer not in (block_pb.WRITER_MODEL, block_pb.WRITER_USER):
        assert reason == "ERROR_REASON_INVALID_ARGUMENT"
