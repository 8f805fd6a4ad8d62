"""ConversationSearchService end to end: a real server (SQLite or PostgreSQL with the embedded
Qdrant engine, and PostgreSQL with the suite's real Qdrant server), the real embedding model,
called through the generated stubs."""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from functools import partial
from pathlib import Path

import grpc
import pytest
from google.protobuf.timestamp_pb2 import Timestamp

from memoria.v1 import audit_service_pb2 as audit_pb
from memoria.v1 import conversation_search_service_pb2 as pb
from memoria.v1 import conversation_search_service_pb2_grpc as pb_grpc
from memoria.v1 import memory_block_pb2 as block_pb
from memoria.v1 import memory_block_service_pb2 as block_service_pb
from memoria.v1 import memory_block_service_pb2_grpc as block_grpc
from server.adapters.qdrant.edge import QdrantEdgeChunkIndex
from server.domain.keywords import KEYWORD_VERSION, KeywordEncoder
from server.domain.model import EncodedQuery, IndexedChunk, SearchScope, TurnKey
from server.domain.relevance import semantic_floor
from tests.api.conftest import (
    Api,
    Metadata,
    expect_error,
    field_violations,
    server_settings,
    serving,
    shared_embedder,
    start_server,
)
from tests.conftest import CITUS, PGBOUNCER, SQL_KINDS
from tests.qdrant_server import QdrantEndpoint

WHEN = datetime(2026, 11, 30, 9, 30, tzinfo=UTC)
INVALID = grpc.StatusCode.INVALID_ARGUMENT


QDRANT_SERVER = pytest.param("qdrant", marks=[pytest.mark.postgres, pytest.mark.qdrant])
ALSO_ON_POOLER_AND_CITUS = pytest.mark.parametrize(
    "api", [*SQL_KINDS, QDRANT_SERVER, PGBOUNCER, CITUS], indirect=True
)
"""Indexing, search, deletion and erasure also behind the transaction-pooling PgBouncer and on
Citus (tests/api/conftest.py, ON_POOLER_AND_CITUS)."""
PURGE_TIMEOUT_S = 30.0


@pytest.fixture(params=[*SQL_KINDS, QDRANT_SERVER])
def api(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Api]:
    """A server on SQLite or PostgreSQL (or PgBouncer, or Citus: ALSO_ON_POOLER_AND_CITUS) with the
    embedded engine, or (`qdrant`) the production pair: PostgreSQL and the suite's real Qdrant
    server, on a collection of this test's own."""
    if request.param != "qdrant":
        settings = server_settings(request.param, request, tmp_path)
    else:
        endpoint: QdrantEndpoint = request.getfixturevalue("qdrant")
        settings = server_settings(
            "postgres",
            request,
            tmp_path,
            qdrant_url=endpoint.url,
            qdrant_grpc_port=endpoint.grpc_port,
            qdrant_collection=request.getfixturevalue("qdrant_collection"),
        )
    with serving(settings) as api:
        yield api


def wait_for_purge(api: Api, principal: str, conversation: str | None = None) -> None:
    """Poll the index (bounded) until the background purge has removed the chunks."""
    deadline = time.monotonic() + PURGE_TIMEOUT_S
    while api.running.index.count(api.tenant, principal, conversation) != 0:
        assert time.monotonic() < deadline, "the chunks were never purged"
        time.sleep(0.05)  # polling the purge of the background worker, bounded


def ts(value: datetime = WHEN) -> Timestamp:
    stamp = Timestamp()
    stamp.FromDatetime(value)
    return stamp


def index(
    api: Api,
    who: Metadata,
    conversation: str,
    turn: str,
    question: str,
    answer: str,
    *,
    wait: bool = True,
    when: datetime = WHEN,
) -> pb.IndexTurnResponse:
    response: pb.IndexTurnResponse = api.search.IndexTurn(
        pb.IndexTurnRequest(
            conversation_id=conversation,
            turn_id=turn,
            question=question,
            answer=answer,
            turn_time=ts(when),
            wait=wait,
        ),
        metadata=who,
    )
    return response


def search(api: Api, who: Metadata, query: str, size: int = 10) -> list[pb.SearchHit]:
    response = api.search.SearchConversations(
        pb.SearchConversationsRequest(query=query, page_size=size), metadata=who
    )
    return list(response.hits)


@ALSO_ON_POOLER_AND_CITUS
def test_indexed_turn_is_found_with_its_ranks_and_time(api: Api) -> None:
    ana = api.who("ana")
    done = index(api, ana, "c1", "t1", "Which airline do I fly?", "You fly with Lufthansa.")
    assert done.outcome == pb.INDEX_TURN_OUTCOME_INDEXED
    assert (done.chunk_count, done.truncated) == (1, False)
    assert done.indexed_char_count == len("Which airline do I fly?\n\nYou fly with Lufthansa.")
    index(api, ana, "c1", "t2", "Best pasta sauce?", "A slow-cooked ragù.")
    (first, *_rest) = search(api, ana, "Lufthansa flights")
    assert (first.conversation_id, first.turn_id, first.chunk_index) == ("c1", "t1", 0)
    assert first.text.startswith("Which airline")
    assert first.keyword_rank == 1 and first.semantic_rank >= 1
    assert first.score > 0
    assert first.turn_time.ToDatetime(tzinfo=UTC) == WHEN


def test_exact_id_ranks_first_among_near_misses(api: Api) -> None:
    ana = api.who("ana")
    for i, account in enumerate(["acct-4822", "acct-4821", "acct-4812", "acct-4828"]):
        index(api, ana, "money", f"t{i}", f"Where did the refund go for {account}?", "To savings.")
    hits = search(api, ana, "acct-4821")
    assert hits[0].turn_id == "t1"
    assert hits[0].keyword_rank == 1


@pytest.mark.parametrize(
    ("query", "turn"),
    [("Ростислав", "ru"), ("東京タワー", "ja"), ("قسنطينة", "ar"), ("北京烤鸭", "zh")],
)
def test_exact_words_of_other_scripts_are_found_first(api: Api, query: str, turn: str) -> None:
    """Among turns of several scripts (and an English one about the same trip), the turn with
    the query's exact word comes first, found by the keyword side."""
    ana = api.who("ana")
    turns = {
        "ru": ("Как зовут моего соседа?", "Его зовут Ростислав, он живёт этажом выше."),  # noqa: RUF001
        "ja": ("週末はどこに行った?", "東京タワーに行って夜景を見ました。"),
        "ar": ("أين تسكن أختي؟", "تسكن أختك في قسنطينة منذ عامين."),
        "zh": ("我在北京吃了什么?", "你吃了北京烤鸭和炸酱面。"),
        "en": ("Where did I travel last year?", "You went to Tokyo, Beijing and Algeria."),
    }
    for turn_id, (question, answer) in turns.items():
        index(api, ana, "trips", turn_id, question, answer)
    (first, *_rest) = search(api, ana, query)
    assert first.turn_id == turn
    assert first.keyword_rank == 1


def test_chunks_of_an_older_keyword_representation_are_encoded_again_while_serving(
    api: Api,
) -> None:
    """Chunks indexed before the turn's date was on the keyword side (version 1, written
    here as an older release wrote them) are re-encoded by the running server's worker from
    their stored text and time; meanwhile and after, search serves them."""
    chunks = api.running.index
    encoder = KeywordEncoder()
    dense = shared_embedder().embed_documents(["we adopted a cat named Miso"])[0]
    may = datetime(2023, 5, 8, 13, 56, tzinfo=UTC)
    for n in range(40):
        text = "we adopted a cat named Miso" if n == 7 else f"an older turn, number {n}"
        chunk = IndexedChunk(0, text, dense, encoder.encode_document(text))
        chunks.upsert_turn(TurnKey(api.tenant, "ana", "old", f"t{n}"), may, [chunk])
    ana = api.who("ana")
    assert search(api, ana, "Miso")[0].turn_id == "t7"  # served before re-encoding
    index(api, ana, "new", "t1", "Anything new?", "Nothing much.", wait=False)  # wakes it
    deadline = time.monotonic() + PURGE_TIMEOUT_S
    while chunks.count_stale_keyword_chunks(KEYWORD_VERSION):
        assert time.monotonic() < deadline, "the old chunks were never encoded again"
        time.sleep(0.05)  # polling the background worker, bounded
    (first, *_rest) = search(api, ana, "8 May 2023 Miso")
    assert (first.turn_id, first.keyword_rank) == ("t7", 1)
    assert first.text == "we adopted a cat named Miso"


def test_paraphrase_is_found_semantically(api: Api) -> None:
    ana = api.who("ana")
    index(api, ana, "health", "t1", "Note this", "I am allergic to peanuts and cashews.")
    index(api, ana, "travel", "t2", "Trip plan", "We take the night train to Vienna in May.")
    hits = search(api, ana, "which foods make me sick?")
    assert hits[0].turn_id == "t1"
    assert hits[0].semantic_rank == 1


def test_one_hit_per_turn_even_when_many_chunks_match(api: Api) -> None:
    ana = api.who("ana")
    long_answer = " ".join(["The zebrafish genome project notes."] * 400)  # ~14,000 chars
    done = index(api, ana, "bio", "long", "Tell me about zebrafish", long_answer)
    assert done.chunk_count >= 4
    index(api, ana, "bio", "short", "zebrafish?", "A small fish.")
    hits = search(api, ana, "zebrafish genome")
    assert sorted(h.turn_id for h in hits) == ["long", "short"]


def test_long_turn_is_cut_at_ten_chunks_and_says_so(api: Api) -> None:
    done = index(api, api.who("ana"), "c", "t", "q", "word " * 9000, wait=False)
    assert done.outcome == pb.INDEX_TURN_OUTCOME_ACCEPTED
    assert (done.chunk_count, done.truncated) == (10, True)
    assert done.indexed_char_count <= 40_000


def test_resending_a_turn_replaces_it(api: Api) -> None:
    ana = api.who("ana")
    index(api, ana, "c", "t", "Favourite colour?", "Vermilion.")
    index(api, ana, "c", "t", "Favourite colour?", "Turquoise.")
    assert search(api, ana, "vermilion") == []  # the old words left with the old text
    (hit,) = search(api, ana, "turquoise")
    assert (hit.turn_id, hit.text) == ("t", "Favourite colour?\n\nTurquoise.")


def test_a_search_that_matches_nothing_answers_nothing(api: Api) -> None:
    """No turn is a strong match (its meaning is far, none holds every term of the query or
    an id of it): no hits, though one turn shares a word ("quarterly") with the query."""
    ana = api.who("ana")
    index(api, ana, "c1", "t1", "Which airline do I fly?", "You fly with Lufthansa.")
    index(api, ana, "c1", "t2", "Plans?", "We went over the quarterly plan and the office move.")
    assert search(api, ana, "quarterly tax filing for my Delaware LLC") == []
    assert search(api, ana, "Lufthansa flights")[0].turn_id == "t1"


def test_an_id_in_a_long_turn_is_found_though_its_meaning_is_far(api: Api) -> None:
    """A query naming an id is a strong match for the turn holding it, whatever its cosine
    (0.16 here, below the model's floor): the keyword side's purpose."""
    ana = api.who("ana")
    plan = "We went over the quarterly plan, the hiring pipeline and the budget in detail. "
    notes = (plan * 45)[:3900] + " The refund went to acct-4821."
    index(api, ana, "calls", "long", "Call notes?", notes)
    index(api, ana, "calls", "other", "Anything else?", "The refund for acct-4822 is pending.")
    floor = semantic_floor(shared_embedder().model_id)
    assert floor is not None
    first = search(api, ana, "acct-4821")[0]
    assert first.turn_id == "long"
    assert first.HasField("semantic_similarity") and first.semantic_similarity < floor
    assert first.keyword_coverage == 1.0


def test_a_turns_measures_are_comparable_across_searches(api: Api) -> None:
    """The same turn for the same query keeps its similarity and keyword coverage when other
    turns change the search around it, while its fused score, relative to the others, moves."""
    ana = api.who("ana")
    index(api, ana, "c1", "t1", "Which airline do I fly?", "You fly with Lufthansa.")
    (alone,) = search(api, ana, "Lufthansa flights")
    index(
        api,
        ana,
        "c2",
        "t2",
        "Delays?",
        "Lufthansa flights to Frankfurt: two Lufthansa flights late.",
    )
    after = {h.turn_id: h for h in search(api, ana, "Lufthansa flights")}
    assert after["t2"].keyword_coverage == 1.0  # lufthansa, flight
    assert alone.keyword_coverage == after["t1"].keyword_coverage == 0.5  # "fly" is not "flight"
    assert alone.semantic_similarity == pytest.approx(after["t1"].semantic_similarity, abs=1e-6)
    assert alone.score == 1.0 and after["t1"].score < 1.0


@ALSO_ON_POOLER_AND_CITUS
def test_background_worker_indexes_without_wait(api: Api) -> None:
    ana = api.who("ana")
    done = index(api, ana, "c", "bg", "Gate code?", "The gate code is 7 7 3 1 quokka.", wait=False)
    assert done.outcome == pb.INDEX_TURN_OUTCOME_ACCEPTED
    # Waiting for the same turn returns once the worker (or this call) has indexed it.
    again = index(api, ana, "c", "bg", "Gate code?", "The gate code is 7 7 3 1 quokka.")
    assert again.outcome == pb.INDEX_TURN_OUTCOME_INDEXED
    assert search(api, ana, "quokka")[0].turn_id == "bg"


@ALSO_ON_POOLER_AND_CITUS
def test_nothing_crosses_principals_or_tenants(api: Api) -> None:
    other_tenant = f"t-{uuid.uuid4().hex[:10]}"
    callers = {
        (tenant, principal): api.who(principal, tenant=tenant)
        for tenant in (api.tenant, other_tenant)
        for principal in ("ana", "bob")
    }
    for (tenant, principal), who in callers.items():
        # Identical conversation ids, turn ids and texts for everyone ...
        index(api, who, "shared", "t1", "My locker number?", "Locker 52 by the pool.")
        # ... plus one private turn each.
        index(api, who, "shared", "mine", "Secret word?", f"The word is marker{tenant}{principal}.")
    for (tenant, principal), who in callers.items():
        hits = search(api, who, "locker pool")
        assert [(h.conversation_id, h.turn_id) for h in hits if h.turn_id == "t1"] == [
            ("shared", "t1")
        ]
        for other_tenant_id, other_principal in callers:
            marker = f"marker{other_tenant_id}{other_principal}"
            found = [h for h in search(api, who, marker) if marker in h.text]
            mine = (other_tenant_id, other_principal) == (tenant, principal)
            assert len(found) == (1 if mine else 0), (tenant, principal, marker)


def test_no_identity_touches_no_index(request: pytest.FixtureRequest, tmp_path: Path) -> None:
    counting = CountingChunkIndex(tmp_path / "chunks")
    running, channel = start_server(server_settings("sqlite", request, tmp_path), index=counting)
    try:
        stub = pb_grpc.ConversationSearchServiceStub(channel)
        calls = [
            lambda: stub.IndexTurn(
                pb.IndexTurnRequest(
                    conversation_id="c",
                    turn_id="t",
                    question="q",
                    answer="a",
                    turn_time=ts(),
                    wait=True,
                )
            ),
            lambda: stub.SearchConversations(pb.SearchConversationsRequest(query="q")),
            lambda: stub.DeleteConversation(pb.DeleteConversationRequest(conversation_id="c")),
            lambda: stub.ErasePrincipalData(pb.ErasePrincipalDataRequest()),
        ]
        for call in calls:
            expect_error(call, grpc.StatusCode.UNAUTHENTICATED, "ERROR_REASON_UNAUTHENTICATED")
        assert counting.calls == []
        # The same server does query the index for an identified caller.
        stub.SearchConversations(
            pb.SearchConversationsRequest(query="q"),
            metadata=(("x-memoria-tenant", "t"), ("x-memoria-principal", "p")),
        )
        assert counting.calls == ["search"]
    finally:
        channel.close()
        running.stop(0)


def test_memory_off_skips_turns_and_finds_nothing(api: Api) -> None:
    ana = api.who("ana")
    index(api, ana, "c", "before", "Dog's name?", "Biscuit the beagle.")
    blocks = block_grpc.MemoryBlockServiceStub(api.channel)
    set_memory(blocks, ana, enabled=False)
    skipped = index(api, ana, "c", "during", "Cat's name?", "Pixel the tabby.")
    assert skipped.outcome == pb.INDEX_TURN_OUTCOME_SKIPPED_MEMORY_DISABLED
    assert skipped.chunk_count == 0
    assert search(api, ana, "beagle") == []
    set_memory(blocks, ana, enabled=True)
    assert [h.turn_id for h in search(api, ana, "beagle")][:1] == ["before"]
    assert all(h.turn_id != "during" for h in search(api, ana, "tabby"))


def set_memory(blocks: block_grpc.MemoryBlockServiceStub, who: Metadata, *, enabled: bool) -> None:
    blocks.UpdateMemorySettings(
        block_service_pb.UpdateMemorySettingsRequest(
            writer=block_pb.WRITER_USER, memory_enabled=enabled
        ),
        metadata=who,
    )


def test_deleted_conversation_is_gone_before_its_purge(
    request: pytest.FixtureRequest, tmp_path: Path
) -> None:
    # No worker threads: the purge never runs, so the chunks stay in the index.
    counting = CountingChunkIndex(tmp_path / "chunks")
    settings = server_settings("sqlite", request, tmp_path, index_worker_threads=0)
    running, channel = start_server(settings, index=counting)
    try:
        stub = pb_grpc.ConversationSearchServiceStub(channel)
        api = Api(running, channel, None, None, "tenant-a", stub)  # type: ignore[arg-type]
        ana = api.who("ana")
        index(api, ana, "doomed", "t1", "Passport number?", "It is X1234567.")
        index(api, ana, "doomed", "t2", "Renewal?", "Renew the passport in March.")
        index(api, ana, "kept", "t1", "Passport office?", "The passport office on Main St.")
        deleted = stub.DeleteConversation(
            pb.DeleteConversationRequest(conversation_id="doomed"), metadata=ana
        )
        assert deleted.deleted_turn_count == 2
        assert counting.count("tenant-a", "ana", "doomed") == 2  # not purged yet ...
        hits = search(api, ana, "passport")
        assert [h.conversation_id for h in hits] == ["kept"]  # ... yet never found
        expect_error(
            lambda: index(api, ana, "doomed", "t3", "Late?", "A late turn."),
            grpc.StatusCode.FAILED_PRECONDITION,
            "ERROR_REASON_CONVERSATION_DELETED",
        )
        again = stub.DeleteConversation(
            pb.DeleteConversationRequest(conversation_id="doomed"), metadata=ana
        )
        assert again.deleted_turn_count == 0
    finally:
        channel.close()
        running.stop(0)


@ALSO_ON_POOLER_AND_CITUS
def test_delete_is_audited_and_the_chunks_are_purged(api: Api) -> None:
    ana = api.who("ana")
    index(api, ana, "trip", "t1", "Hotel?", "Hotel Sacher, room 214.")
    api.search.DeleteConversation(
        pb.DeleteConversationRequest(conversation_id="trip"), metadata=ana
    )
    assert search(api, ana, "Sacher") == []
    events = api.audit.ListAuditEvents(audit_pb.ListAuditEventsRequest(), metadata=ana).events
    assert events[0].action == audit_pb.AUDIT_ACTION_CONVERSATION_DELETED
    assert (events[0].conversation_id, events[0].deleted_turn_count) == ("trip", 1)
    wait_for_purge(api, "ana", "trip")


@ALSO_ON_POOLER_AND_CITUS
def test_erase_own_data(api: Api) -> None:
    ana = api.who("ana")
    blocks = block_grpc.MemoryBlockServiceStub(api.channel)
    blocks.RewriteMemoryBlock(
        block_service_pb.RewriteMemoryBlockRequest(
            text="Prefers tea\nLives in Graz", writer=block_pb.WRITER_USER
        ),
        metadata=ana,
    )
    index(api, ana, "c", "t1", "Where do I live?", "Graz, Austria.")
    index(api, api.who("bob"), "c", "t1", "Where do I live?", "Graz, Austria.")
    erased = api.search.ErasePrincipalData(pb.ErasePrincipalDataRequest(), metadata=ana)
    assert (erased.removed_line_count, erased.deleted_turn_count) == (2, 1)
    assert search(api, ana, "Graz") == []
    assert [h.turn_id for h in search(api, api.who("bob"), "Graz")] == ["t1"]
    wait_for_purge(api, "ana")
    assert api.running.index.count(api.tenant, "bob") == 1
    block = blocks.GetMemoryBlock(block_service_pb.GetMemoryBlockRequest(), metadata=ana)
    assert block.memory_block.text == ""
    events = api.audit.ListAuditEvents(audit_pb.ListAuditEventsRequest(), metadata=ana).events
    assert events[0].action == audit_pb.AUDIT_ACTION_PRINCIPAL_DATA_ERASED
    assert (events[0].removed_line_count, events[0].deleted_turn_count) == (2, 1)
    assert all(not e.added_lines and not e.removed_lines for e in events)
    # The principal starts again from nothing.
    index(api, ana, "c", "t1", "Where do I live?", "Now in Linz.")
    assert [h.turn_id for h in search(api, ana, "Linz")] == ["t1"]


def test_only_an_admin_erases_another_principal(api: Api) -> None:
    index(api, api.who("bob"), "c", "t1", "Shoe size?", "Size 44.")
    expect_error(
        lambda: api.search.ErasePrincipalData(
            pb.ErasePrincipalDataRequest(principal_id="bob"), metadata=api.who("ana")
        ),
        grpc.StatusCode.PERMISSION_DENIED,
        "ERROR_REASON_PERMISSION_DENIED",
    )
    assert search(api, api.who("bob"), "shoe size")
    admin = api.who("root", roles="memoria-admin")
    erased = api.search.ErasePrincipalData(
        pb.ErasePrincipalDataRequest(principal_id="bob"), metadata=admin
    )
    assert erased.deleted_turn_count == 1
    assert search(api, api.who("bob"), "shoe size") == []
    events = api.audit.ListAuditEvents(
        audit_pb.ListAuditEventsRequest(principal_id="bob"), metadata=admin
    ).events
    assert (events[0].principal_id, events[0].actor_principal_id) == ("bob", "root")


@pytest.mark.parametrize(
    ("request_fields", "field"),
    [
        ({"conversation_id": "", "turn_id": "t"}, "conversation_id"),
        ({"conversation_id": "c", "turn_id": ""}, "turn_id"),
        ({"conversation_id": "c" * 129, "turn_id": "t"}, "conversation_id"),
        ({"conversation_id": "c\u200b", "turn_id": "t"}, "conversation_id"),
        ({"conversation_id": "c", "turn_id": "t", "question": " ", "answer": "\u200b"}, "question"),
        ({"conversation_id": "c", "turn_id": "t", "no_time": True}, "turn_time"),
    ],
)
def test_invalid_turns_are_refused_with_the_field(
    api: Api, request_fields: dict[str, object], field: str
) -> None:
    values = {"question": "q", "answer": "a", **request_fields}
    no_time = values.pop("no_time", False)
    req = pb.IndexTurnRequest(**values)  # type: ignore[arg-type]
    if not no_time:
        req.turn_time.CopyFrom(ts())
    error = expect_error(
        lambda: api.search.IndexTurn(req, metadata=api.who("ana")),
        INVALID,
        "ERROR_REASON_INVALID_ARGUMENT",
    )
    assert field in field_violations(error)


@pytest.mark.parametrize(
    ("query", "size", "field"),
    [
        ("", 10, "query"),
        ("  \u200b", 10, "query"),
        ("q", -1, "page_size"),
        ("x" * 4001, 1, "query"),
    ],
)
def test_invalid_searches_are_refused(api: Api, query: str, size: int, field: str) -> None:
    error = expect_error(
        lambda: search(api, api.who("ana"), query, size), INVALID, "ERROR_REASON_INVALID_ARGUMENT"
    )
    assert field in field_violations(error)


def test_bounds_return_the_best_turns_within_them(api: Api) -> None:
    ana = api.who("ana")
    # The more a turn repeats "heron", the better it ranks; the best ones lie outside.
    for day in range(1, 6):
        for conversation in ("birds", "walks"):
            question = f"Did we see the heron? {'heron ' * day}"
            when = WHEN + timedelta(days=day)
            index(api, ana, conversation, f"d{day}", question, "Yes, by the lake.", when=when)
    index(api, api.who("bob"), "birds", "b", "heron " * 9, "Bob's heron.", when=WHEN)

    def bounded(**fields: object) -> list[tuple[str, str]]:
        request = pb.SearchConversationsRequest(query="heron", page_size=2, **fields)  # type: ignore[arg-type]
        hits = api.search.SearchConversations(request, metadata=ana).hits
        return [(h.conversation_id, h.turn_id) for h in hits]

    span = {"start_time": ts(WHEN + timedelta(days=2)), "end_time": ts(WHEN + timedelta(days=4))}
    # Within [day 2, day 4): day 3 first; its two conversations tie, and so would day 2's.
    assert {turn for _, turn in bounded(**span)} == {"d3"}
    assert bounded(conversation_id="walks", **span) == [("walks", "d3"), ("walks", "d2")]
    assert bounded(conversation_id="walks", end_time=ts(WHEN + timedelta(days=2))) == [
        ("walks", "d1")
    ]
    assert bounded(start_time=ts(WHEN + timedelta(days=6))) == []
    assert bounded(conversation_id="elsewhere") == []


def test_invalid_bounds_are_refused_with_the_field(api: Api) -> None:
    late = ts(WHEN + timedelta(days=1))
    out_of_range = Timestamp(seconds=400_000_000_000)
    cases: list[tuple[dict[str, object], str]] = [
        ({"start_time": late, "end_time": late}, "end_time"),
        ({"start_time": late, "end_time": ts()}, "end_time"),
        ({"conversation_id": "c" * 129}, "conversation_id"),
        ({"conversation_id": "c\u200b"}, "conversation_id"),
        ({"start_time": out_of_range}, "start_time"),
        ({"end_time": out_of_range}, "end_time"),
    ]
    for fields, field in cases:
        request = pb.SearchConversationsRequest(query="heron", **fields)  # type: ignore[arg-type]
        error = expect_error(
            partial(api.search.SearchConversations, request, metadata=api.who("ana")),
            INVALID,
            "ERROR_REASON_INVALID_ARGUMENT",
        )
        assert list(field_violations(error)) == [field], fields


def test_page_size_caps_the_turns(api: Api) -> None:
    ana = api.who("ana")
    for i in range(4):
        index(api, ana, "c", f"t{i}", f"Note {i} about kayaks", "Kayak notes.")
    assert len(search(api, ana, "kayak", size=2)) == 2
    assert len(search(api, ana, "kayak", size=0)) == 4


class CountingChunkIndex(QdrantEdgeChunkIndex):
    """The real embedded index, recording which calls reached it."""

    def __init__(self, path: Path) -> None:
        embedder = shared_embedder()
        super().__init__(path, embedder.dimension, embedder.model_id)
        self.calls: list[str] = []

    def search(self, scope: SearchScope, query: EncodedQuery, turns: int):  # type: ignore[no-untyped-def]
        self.calls.append("search")
        return super().search(scope, query, turns)

    def upsert_turn(self, *args, **kwargs):  # type: ignore[no-untyped-def]
        self.calls.append("upsert_turn")
        return super().upsert_turn(*args, **kwargs)

    def delete_principal(self, *args, **kwargs):  # type: ignore[no-untyped-def]
        self.calls.append("delete_principal")
        return super().delete_principal(*args, **kwargs)

    def delete_conversation(self, *args, **kwargs):  # type: ignore[no-untyped-def]
        self.calls.append("delete_conversation")
        return super().delete_conversation(*args, **kwargs)
