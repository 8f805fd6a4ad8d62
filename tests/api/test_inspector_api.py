"""The inspector end to end (issue 12, item 3): a render and a search that name a turn are
recorded for it, GetTurnInspection returns them (with whether the block changed since), only
to their principal, and the records go with the conversation, with erasure and after the
retention. A real server on SQLite and on PostgreSQL (as the service role, so RLS applies)."""

from __future__ import annotations

from datetime import UTC, timedelta

import grpc
from sqlalchemy import func, select

from memoria.v1 import conversation_search_service_pb2 as pb
from memoria.v1 import memory_block_pb2 as block_pb
from memoria.v1 import memory_block_service_pb2 as block_service_pb
from server.adapters.sql.inspections import SqlInspectionStore
from server.adapters.sql.tables import turn_inspections
from server.runtime.builders import utc_now
from tests.api.conftest import (
    ON_POOLER_AND_CITUS,
    Api,
    Metadata,
    expect_error,
    field_violations,
)
from tests.api.test_search_api import WHEN, index, ts

INVALID = grpc.StatusCode.INVALID_ARGUMENT


def turn(conversation: str = "c1", turn_id: str = "t1") -> block_pb.TurnReference:
    return block_pb.TurnReference(conversation_id=conversation, turn_id=turn_id)


def inspect(api: Api, who: Metadata, ref: block_pb.TurnReference) -> pb.TurnInspection:
    response = api.search.GetTurnInspection(pb.GetTurnInspectionRequest(turn=ref), metadata=who)
    inspection: pb.TurnInspection = response.inspection
    return inspection


def rewrite(api: Api, who: Metadata, text: str) -> str:
    response = api.blocks.RewriteMemoryBlock(
        block_service_pb.RewriteMemoryBlockRequest(text=text, writer=block_pb.WRITER_USER),
        metadata=who,
    )
    etag: str = response.memory_block.etag
    return etag


def render(
    api: Api, who: Metadata, ref: block_pb.TurnReference | None = None
) -> block_service_pb.RenderMemoryBlockResponse:
    request = block_service_pb.RenderMemoryBlockRequest(turn=ref)
    response: block_service_pb.RenderMemoryBlockResponse = api.blocks.RenderMemoryBlock(
        request, metadata=who
    )
    return response


def recorded(api: Api, tenant: str | None = None) -> int:
    """How many records the tenant has (as the service role, under its tenant's scope), once
    the server's background writer has written what was recorded before."""
    assert api.running.inspections is not None
    api.running.inspections.flush()
    stmt = select(func.count()).select_from(turn_inspections)
    with api.running.store.transaction(tenant or api.tenant) as tx:
        count: int = tx.connection.execute(
            stmt.where(turn_inspections.c.tenant_id == (tenant or api.tenant))
        ).scalar_one()
    return count


def search(
    api: Api, who: Metadata, query: str, ref: block_pb.TurnReference | None
) -> list[pb.SearchHit]:
    request = pb.SearchConversationsRequest(query=query, turn=ref)
    return list(api.search.SearchConversations(request, metadata=who).hits)


def test_render_and_search_are_recorded_for_the_turn(api: Api) -> None:
    ana = api.who("ana")
    etag = rewrite(api, ana, "Preferred name: Ana\nUses acct-4821")
    index(api, ana, "old", "t0", "Which account got the refund?", "acct-4821, on Monday.")
    rendered = render(api, ana, turn())
    hits = search(api, ana, "acct-4821 refund", turn())
    assert [h.turn_id for h in hits] == ["t0"]
    got = inspect(api, ana, turn())
    assert got.turn == turn()
    assert [(r.etag, r.char_count) for r in got.renders] == [(etag, rendered.char_count)]
    assert got.renders[0].render_time.seconds > 0
    assert (got.current_etag, got.block_changed, got.renders[0].block_changed) == (
        etag,
        False,
        False,
    )
    (record,) = got.searches
    assert (record.query, record.hit_count) == ("acct-4821 refund", 1)
    (hit,) = record.hits
    assert (hit.conversation_id, hit.turn_id, hit.chunk_index) == ("old", "t0", 0)
    assert (hit.keyword_rank, hit.semantic_rank, hit.score) == (
        hits[0].keyword_rank,
        hits[0].semantic_rank,
        hits[0].score,
    )
    assert hit.text == hits[0].text  # read live from the index
    # An unbounded search records no bounds.
    assert record.conversation_id == ""
    assert not record.HasField("start_time") and not record.HasField("end_time")
    # Another turn of the same conversation has its own (empty) record.
    other = inspect(api, ana, turn("c1", "t2"))
    assert (len(other.renders), len(other.searches), other.block_changed) == (0, 0, False)


@ON_POOLER_AND_CITUS
def test_a_bounded_search_is_recorded_with_its_bounds(api: Api) -> None:
    """The conversation and the span a search was bounded to come back with its record, to
    the microsecond, and each side left open stays unset; so a person reading "0 found" sees
    where the model looked."""
    ana = api.who("ana")
    index(api, ana, "trip", "t0", "Which hotel did we book?", "The Alma, in Lisbon.")
    start = WHEN - timedelta(days=7, microseconds=250)
    end = WHEN + timedelta(hours=1, microseconds=7)
    bounded = pb.SearchConversationsRequest(
        query="hotel Lisbon",
        turn=turn(),
        conversation_id="trip",
        start_time=ts(start),
        end_time=ts(end),
    )
    found = api.search.SearchConversations(bounded, metadata=ana).hits
    assert [h.turn_id for h in found] == ["t0"]
    after_only = pb.SearchConversationsRequest(
        query="hotel", turn=turn(), start_time=ts(WHEN + timedelta(days=1))
    )
    assert list(api.search.SearchConversations(after_only, metadata=ana).hits) == []
    first, second = inspect(api, ana, turn()).searches
    assert first.conversation_id == "trip"
    assert (first.start_time.ToDatetime(UTC), first.end_time.ToDatetime(UTC)) == (start, end)
    assert (first.hit_count, second.hit_count) == (1, 0)
    assert second.conversation_id == "" and not second.HasField("end_time")
    assert second.start_time.ToDatetime(UTC) == WHEN + timedelta(days=1)


def test_without_a_turn_nothing_is_recorded(api: Api) -> None:
    ana = api.who("ana")
    rewrite(api, ana, "Likes tea")
    render(api, ana)
    search(api, ana, "tea", None)
    assert recorded(api) == 0
    render(api, ana, turn())
    assert recorded(api) == 1


def test_block_changed_since_the_render(api: Api) -> None:
    ana = api.who("ana")
    first = rewrite(api, ana, "Likes tea")
    render(api, ana, turn())
    second = rewrite(api, ana, "Likes coffee")
    got = inspect(api, ana, turn())
    assert [r.etag for r in got.renders] == [first]
    assert (got.current_etag, got.block_changed, got.renders[0].block_changed) == (
        second,
        True,
        True,
    )
    render(api, ana, turn())
    again = inspect(api, ana, turn())
    assert [r.block_changed for r in again.renders] == [True, False]
    assert again.block_changed is False


def test_records_are_isolated_across_principals_and_tenants(api: Api) -> None:
    ana = api.who("ana")
    rewrite(api, ana, "Likes tea")
    render(api, ana, turn())
    for stranger in (api.who("bob"), api.who("ana", tenant=api.tenant + "-other")):
        got = inspect(api, stranger, turn())
        assert (len(got.renders), len(got.searches)) == (0, 0)
    # Even an administrator reads only its own turns: the turn reference names no principal.
    admin = api.who("root", roles="memoria-admin")
    assert len(inspect(api, admin, turn()).renders) == 0
    assert len(inspect(api, ana, turn()).renders) == 1


def test_deleting_the_conversation_removes_its_records_and_hits(api: Api) -> None:
    ana = api.who("ana")
    index(api, ana, "secret", "t0", "Where is the spare key?", "Under the blue flowerpot.")
    index(api, ana, "c1", "t0", "What is the spare key for?", "The garden shed.")
    render(api, ana, turn("secret", "t9"))
    search(api, ana, "spare key flowerpot", turn("c1", "t1"))
    before = inspect(api, ana, turn("c1", "t1")).searches[0]
    assert {h.conversation_id for h in before.hits} == {"secret", "c1"}
    api.search.DeleteConversation(
        pb.DeleteConversationRequest(conversation_id="secret"), metadata=ana
    )
    assert len(inspect(api, ana, turn("secret", "t9")).renders) == 0
    after = inspect(api, ana, turn("c1", "t1")).searches[0]
    assert [h.conversation_id for h in after.hits] == ["c1"]
    assert all("flowerpot" not in h.text for h in after.hits)
    assert after.hit_count == 2
    # A late render for the deleted conversation is not recorded.
    render(api, ana, turn("secret", "t9"))
    assert len(inspect(api, ana, turn("secret", "t9")).renders) == 0


def test_erasure_removes_and_counts_the_records(api: Api) -> None:
    ana = api.who("ana")
    rewrite(api, ana, "Likes tea")
    render(api, ana, turn())
    render(api, ana, turn("c1", "t2"))
    search(api, ana, "tea", turn())
    render(api, api.who("bob"), turn())
    erased = api.search.ErasePrincipalData(pb.ErasePrincipalDataRequest(), metadata=ana)
    assert erased.deleted_inspection_count == 3
    got = inspect(api, ana, turn())
    assert (len(got.renders), len(got.searches)) == (0, 0)
    assert len(inspect(api, api.who("bob"), turn()).renders) == 1


def test_records_past_the_retention_are_purged(api: Api) -> None:
    ana = api.who("ana")
    other = api.tenant + "-other"
    render(api, ana, turn())
    render(api, api.who("bob", tenant=other), turn())
    store = SqlInspectionStore(api.running.store.db)
    store.purge(utc_now() - timedelta(days=30), 100)
    assert (recorded(api), recorded(api, other)) == (1, 1)
    # Later than both records: the purge removes them across tenants, in batches.
    later = utc_now() + timedelta(seconds=1)
    assert store.purge(later, 1) == 1
    while store.purge(later, 100):
        pass
    assert (recorded(api), recorded(api, other)) == (0, 0)
    assert len(inspect(api, ana, turn()).renders) == 0


def test_unauthenticated_calls_record_nothing(api: Api) -> None:
    for call in (
        lambda: render(api, (), turn()),
        lambda: search(api, (), "tea", turn()),
        lambda: inspect(api, (), turn()),
    ):
        expect_error(call, grpc.StatusCode.UNAUTHENTICATED, "ERROR_REASON_UNAUTHENTICATED")
    assert recorded(api) == 0


def test_invalid_turn_references_are_refused(api: Api) -> None:
    ana = api.who("ana")
    bad = block_pb.TurnReference(conversation_id="", turn_id="x" * 129)
    for call in (
        lambda: render(api, ana, bad),
        lambda: search(api, ana, "tea", bad),
        lambda: inspect(api, ana, bad),
    ):
        error = expect_error(call, INVALID, "ERROR_REASON_INVALID_ARGUMENT")
        assert set(field_violations(error)) == {"turn.conversation_id", "turn.turn_id"}
    error = expect_error(
        lambda: api.search.GetTurnInspection(pb.GetTurnInspectionRequest(), metadata=ana),
        INVALID,
        "ERROR_REASON_INVALID_ARGUMENT",
    )
    assert set(field_violations(error)) == {"turn"}
