"""No credential is stored, end to end: a real server refuses a block with one (nothing saved,
nothing audited) and stores a conversation turn only with its credentials replaced."""

from __future__ import annotations

import grpc

from memoria.v1 import audit_service_pb2 as audit_pb
from memoria.v1 import memory_block_pb2 as block_pb
from memoria.v1 import memory_block_service_pb2 as block_service_pb
from tests.api.conftest import Api, Metadata, error_info, expect_error, field_violations
from tests.api.test_search_api import index, search

AWS_KEY = "AKIAIOSFODNN7EXAMPLE"  # AWS's documentation example, not a real key


def _audit_text(api: Api, who: Metadata) -> str:
    events = api.audit.ListAuditEvents(
        audit_pb.ListAuditEventsRequest(page_size=500), metadata=who
    ).events
    return repr(list(events))


def test_a_block_with_a_credential_is_refused_naming_the_line(api: Api) -> None:
    who = api.who("ana")
    rewrite = api.blocks.RewriteMemoryBlock
    first = rewrite(
        block_service_pb.RewriteMemoryBlockRequest(
            text="Preferred name: Ana", writer=block_pb.WRITER_USER
        ),
        metadata=who,
    ).memory_block
    events_before = _audit_text(api, who)

    error = expect_error(
        lambda: rewrite(
            block_service_pb.RewriteMemoryBlockRequest(
                text=f"Preferred name: Ana\nUses Jira account ana-42\nBackup key {AWS_KEY}",
                writer=block_pb.WRITER_MODEL,
            ),
            metadata=who,
        ),
        grpc.StatusCode.INVALID_ARGUMENT,
        "ERROR_REASON_SECRET_DETECTED",
    )

    assert field_violations(error) == {
        "text[line 3]": "contains a credential (AWS access key); credentials are never stored"
    }
    assert error_info(error).metadata["secret_types"] == "AWS access key"
    assert AWS_KEY not in (error.details() or "")
    block = api.blocks.GetMemoryBlock(
        block_service_pb.GetMemoryBlockRequest(), metadata=who
    ).memory_block
    assert (block.text, block.etag) == (first.text, first.etag)
    audit = _audit_text(api, who)
    assert audit == events_before
    assert AWS_KEY not in audit


def test_a_turn_is_stored_and_found_with_its_credentials_replaced(api: Api) -> None:
    who = api.who("ana")
    response = index(
        api,
        who,
        "c-1",
        "1",
        "How do I connect? My password: hunter2",
        f"Use postgres://admin:s3cretpw@db.example.com/app and key {AWS_KEY}.",
    )
    assert response.chunk_count == 1

    hits = search(api, who, "how do I connect to the database")
    assert [h.turn_id for h in hits] == ["1"]
    text = hits[0].text
    assert "[redacted: password]" in text
    assert "[redacted: password in a URL]" in text
    assert "[redacted: AWS access key]" in text
    for secret in ("hunter2", "s3cretpw", AWS_KEY):
        assert secret not in text
        assert all(secret not in hit.text for hit in search(api, who, secret))
    assert "postgres://admin:" in text and "db.example.com/app" in text
