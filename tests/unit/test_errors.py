"""The error table: every domain reason exists in the contract and maps to one status."""

from __future__ import annotations

import grpc
from google.rpc import error_details_pb2
from grpc_status import rpc_status

from memoria.v1 import error_reason_pb2
from server.domain.errors import ErrorReason, FieldViolation, MemoriaError
from server.rpc.errors import ERROR_DOMAIN, STATUS_OF, internal_status, to_status


def test_domain_reasons_and_contract_reasons_are_the_same_set() -> None:
    contract = {
        value.name.removeprefix("ERROR_REASON_")
        for value in error_reason_pb2.DESCRIPTOR.enum_types_by_name["ErrorReason"].values
        if value.number != 0
    }
    assert contract == {r.name for r in ErrorReason}


def test_every_reason_has_a_status_code() -> None:
    assert set(STATUS_OF) == set(ErrorReason)
    assert grpc.StatusCode.OK not in STATUS_OF.values()


def test_status_carries_error_info_and_bad_request() -> None:
    error = MemoriaError(
        ErrorReason.BLOCK_TOO_LONG,
        "too long",
        metadata={"char_count": "4001", "char_limit": "4000"},
        violations=(FieldViolation("text", "too long"),),
    )
    status = to_status(error)
    assert status.code is grpc.StatusCode.INVALID_ARGUMENT
    decoded = rpc_status.status_pb2.Status.FromString(
        dict(status.trailing_metadata)["grpc-status-details-bin"]
    )
    info, bad = error_details_pb2.ErrorInfo(), error_details_pb2.BadRequest()
    assert decoded.details[0].Unpack(info) and decoded.details[1].Unpack(bad)
    assert info.reason == "ERROR_REASON_BLOCK_TOO_LONG"
    assert info.domain == ERROR_DOMAIN
    assert dict(info.metadata) == {"char_count": "4001", "char_limit": "4000"}
    assert bad.field_violations[0].field == "text"


def test_internal_status_names_only_the_trace_id() -> None:
    status = internal_status("abc123")
    assert status.code is grpc.StatusCode.INTERNAL
    assert status.details == "internal error; reference abc123"
