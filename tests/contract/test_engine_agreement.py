"""The embedded engine and a real Qdrant server answer every search alike, on random data.

The contract suite (test_chunk_index.py) checks each ChunkIndex on hand-made cases; this test
checks the two engines against each other where no case was thought of: random principals
(the same principal id in two tenants, the same conversation ids under several principals),
turns drawn from one shared vocabulary with a few rare ids (`acct-4821`) among them, long turns
of several chunks, turns sent again with other text, deleted conversations (searched before
and after their chunks are purged) and an erased principal. Both run the service's own path
over the SQLite turn queue: `TurnIntake` and the domain's `Indexer` (chunking, keyword context,
encoding), `ConversationSearch` (fusion, best chunk per turn) and `ConversationRemoval`; only
the chunk index differs. The embedder is a small deterministic bag of words (the model adds
nothing to what is compared here and would take most of the time); like the real one, it
gives a long text several windows.

Both sides are also compared below the fusion, each retrieval side for small `turns`, where
the embedded adapter's own grouping (candidates, fetch rounds, first chunk per turn) and the
server's group-by must keep the same turns.
"""

from __future__ import annotations

import contextlib
import hashlib
import math
import random
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from server.adapters.qdrant.edge import QdrantEdgeChunkIndex
from server.adapters.qdrant.server import QdrantServerChunkIndex
from server.adapters.sql import migrate
from server.adapters.sql.blocks import SqlMemoryStore
from server.adapters.sql.database import SqlDatabase
from server.adapters.sql.engine import create_store_engine, sqlite_url
from server.adapters.sql.turns import SqlTurnStore
from server.adapters.sql.unit_of_work import SqlUnitsOfWork
from server.domain.indexing import Indexer
from server.domain.intake import TurnIntake
from server.domain.keywords import KeywordEncoder
from server.domain.model import (
    ChunkHit,
    EncodedQuery,
    Identity,
    SearchBounds,
    SearchHit,
    SearchScope,
)
from server.domain.ports import ChunkIndex
from server.domain.removal import ConversationRemoval
from server.domain.search import MAX_PAGE_SIZE, ConversationSearch
from tests.qdrant_server import QdrantEndpoint

pytestmark = pytest.mark.qdrant

DIM = 16
WINDOW_WORDS = 60
"""Words per embedding window: a long turn's chunk gets several vectors (MAX_SIM)."""
T0 = datetime(2026, 5, 8, 9, 0, tzinfo=UTC)
SCORE_TOLERANCE = 1e-5
"""Both engines are Qdrant's segment code, but the server scores in its own process (SIMD
paths, float32 sums in another order may differ in the last bits); a fused score is at most 1."""

COMMON = (  # noqa: SIM905 (a word list reads best as text)
    "invoice payment refund account order delivery parcel address meeting calendar "
    "flight hotel booking doctor appointment birthday garden recipe dinner password "
    "laptop printer budget salary holiday train ticket museum concert guitar lesson "
    "running swimming yesterday tomorrow morning evening weekend project deadline report"
).split()
RARE = ("acct-4821", "INC-20931", "po-7781-b", "ana@example.com", "2026-11-30", "4821")
STOP = ("the", "and", "of", "to", "was", "with")
PRINCIPALS = (("t1", "ana"), ("t1", "bob"), ("t2", "ana"))
"""The same principal id in two tenants: only the tenant tells them apart."""
CONVERSATIONS = ("c1", "c2", "c3", "c4")
"""The same conversation ids under every principal: deleting ana's c1 leaves bob's."""
PAGE_SIZES = (3, MAX_PAGE_SIZE)


class BagOfWordsEmbedder:
    """Deterministic unit vectors: the normalized sum of a hashed vector per word, per window
    of WINDOW_WORDS words. Texts sharing words are near each other, identical word bags tie."""

    model_id = "bag-of-words-16"
    dimension = DIM

    def embed_documents(self, texts: Sequence[str]) -> list[tuple[tuple[float, ...], ...]]:
        return [self._windows(text) for text in texts]

    def embed_query(self, text: str) -> tuple[float, ...]:
        return self._windows(text)[0]

    def _windows(self, text: str) -> tuple[tuple[float, ...], ...]:
        words = text.lower().split() or [""]
        return tuple(_bag(words[i : i + WINDOW_WORDS]) for i in range(0, len(words), WINDOW_WORDS))


def _word_vector(word: str) -> list[float]:
    digest = hashlib.blake2b(word.encode(), digest_size=DIM).digest()
    return [b - 127.5 for b in digest]


def _bag(words: Sequence[str]) -> tuple[float, ...]:
    total = [0.0] * DIM
    for word in words:
        total = [a + b for a, b in zip(total, _word_vector(word), strict=True)]
    norm = math.sqrt(sum(x * x for x in total)) or 1.0
    return tuple(x / norm for x in total)


@dataclass
class Service:
    """One engine behind the service's search path, on its own SQLite turn queue."""

    intake: TurnIntake
    search: ConversationSearch
    removal: ConversationRemoval
    indexer: Indexer
    turns: SqlTurnStore
    index: ChunkIndex
    keywords: KeywordEncoder
    embedder: BagOfWordsEmbedder


@contextlib.contextmanager
def _service(directory: Path, index: ChunkIndex, clock: Clock) -> Iterator[Service]:
    """The service's search parts as server/runtime/app.py wires them, over `index`."""
    directory.mkdir()
    engine = create_store_engine(sqlite_url(directory), pool_size=2)
    migrate.upgrade(engine)
    db = SqlDatabase(engine)
    turns = SqlTurnStore(db)
    embedder = BagOfWordsEmbedder()
    keywords = KeywordEncoder()
    units = SqlUnitsOfWork(db)
    indexer = Indexer(turns, index, embedder, keywords, clock)
    intake = TurnIntake(units, indexer, clock)
    search = ConversationSearch(SqlMemoryStore(db), turns, embedder, keywords, index, clock)
    removal = ConversationRemoval(units, index, clock)
    try:
        yield Service(intake, search, removal, indexer, turns, index, keywords, embedder)
    finally:
        db.dispose()


class Clock:
    """The same fixed clock for both services (the turn queue's due times follow it)."""

    def __call__(self) -> datetime:
        return T0 + timedelta(days=30)


@pytest.fixture
def services(
    tmp_path: Path, qdrant: QdrantEndpoint, qdrant_collection: str
) -> Iterator[tuple[Service, Service]]:
    clock = Clock()
    with contextlib.ExitStack() as stack:
        edge = QdrantEdgeChunkIndex(tmp_path / "edge-chunks", DIM, BagOfWordsEmbedder.model_id)
        stack.callback(edge.close)
        client = qdrant.client()
        stack.callback(client.close)
        server = QdrantServerChunkIndex(client, qdrant_collection, DIM, BagOfWordsEmbedder.model_id)
        stack.callback(server.close)
        yield (
            stack.enter_context(_service(tmp_path / "edge", edge, clock)),
            stack.enter_context(_service(tmp_path / "server", server, clock)),
        )


# --- Random data ---------------------------------------------------------------------------


def _words(rng: random.Random, count: int) -> str:
    # Zipf-like weights: a few words in most turns, many in few; now and then a rare id.
    words = rng.choices(COMMON, weights=[1 / (i + 1) for i in range(len(COMMON))], k=count)
    for _ in range(rng.choice((0, 0, 0, 1, 2))):
        words.insert(rng.randrange(len(words) + 1), rng.choice(RARE))
    for _ in range(count // 4):
        words.insert(rng.randrange(len(words) + 1), rng.choice(STOP))
    return " ".join(words)


def _turn_text(rng: random.Random) -> tuple[str, str]:
    """A question and an answer; one turn in eight is long enough for several chunks."""
    if rng.random() < 0.125:
        return _words(rng, rng.randint(3, 8)), _words(rng, rng.randint(700, 1500))
    return _words(rng, rng.randint(2, 12)), _words(rng, rng.randint(0, 30))


def _queries(rng: random.Random) -> list[str]:
    return [
        *(_words(rng, rng.randint(1, 3)) for _ in range(4)),
        rng.choice(RARE),
        f"{rng.choice(RARE)} {rng.choice(COMMON)}",
        "zebra quantum",  # no indexed word: the semantic side alone ranks
        "the and of",  # stop words only: no keyword terms at all
    ]


# --- Comparison ----------------------------------------------------------------------------


def _groups(
    ranked: Sequence[tuple[tuple[str, ...], float]],
) -> list[tuple[float, frozenset[tuple[str, ...]]]]:
    """Consecutive entries of equal score (within SCORE_TOLERANCE of the group's first) as
    one group. Equal scores are a tie the engines may break differently (the server returns
    equal-scored points in any order, and the fusion breaks a tie by each side's rank), so
    only the groups' order is the ranking both must agree on."""
    groups: list[tuple[float, set[tuple[str, ...]]]] = []
    for item, score in ranked:
        if groups and abs(groups[-1][0] - score) <= SCORE_TOLERANCE:
            groups[-1][1].add(item)
        else:
            groups.append((score, {item}))
    return [(score, frozenset(items)) for score, items in groups]


def _assert_same_ranking(
    what: str,
    embedded: Sequence[tuple[tuple[str, ...], float]],
    server: Sequence[tuple[tuple[str, ...], float]],
    limit: int,
) -> None:
    """The same items in the same order of scores. When the list was cut at `limit`, its last
    group may be part of a larger tie, and each engine may have kept other members of it:
    there only the score and the count must agree."""
    assert len(embedded) == len(server), f"{what}: {len(embedded)} against {len(server)} hits"
    assert len({item for item, _ in embedded}) == len(embedded), f"{what}: a turn twice"
    ours, theirs = _groups(embedded), _groups(server)
    assert len(ours) == len(theirs), f"{what}:\n{embedded}\n{server}"
    for i, ((score_a, items_a), (score_b, items_b)) in enumerate(zip(ours, theirs, strict=True)):
        assert score_a == pytest.approx(score_b, abs=SCORE_TOLERANCE), f"{what}: group {i}"
        if i == len(ours) - 1 and len(embedded) == limit:
            assert len(items_a) == len(items_b), f"{what}: last group {i}"
        else:
            assert items_a == items_b, f"{what}: group {i}\n{embedded}\n{server}"


def _fused(hits: Sequence[SearchHit]) -> list[tuple[tuple[str, ...], float]]:
    return [((h.conversation_id, h.turn_id), h.score) for h in hits]


def _side(hits: Sequence[ChunkHit]) -> list[tuple[tuple[str, ...], float]]:
    return [((h.conversation_id, h.turn_id), h.score) for h in hits]


def _bounds(rng: random.Random) -> SearchBounds:
    """Random bounds on the turns' time grid (T0 + 5 min steps): one conversation or every
    one, and each end open or on the grid (a start exactly at a turn's time includes it)."""
    start = rng.randrange(35)
    return SearchBounds(
        conversation_id=rng.choice((None, *CONVERSATIONS)),
        start_time=rng.choice((None, T0 + timedelta(minutes=5 * start))),
        end_time=rng.choice((None, T0 + timedelta(minutes=5 * rng.randrange(start + 1, 41)))),
    )


def _within(hit: SearchHit, bounds: SearchBounds) -> bool:
    return (
        bounds.conversation_id in (None, hit.conversation_id)
        and (bounds.start_time is None or hit.turn_time >= bounds.start_time)
        and (bounds.end_time is None or hit.turn_time < bounds.end_time)
    )


def _compare_searches(rng: random.Random, a: Service, b: Service, stage: str) -> int:
    """Every principal's random queries on both; returns how many hits were compared."""
    compared = 0
    for tenant, principal in PRINCIPALS:
        who = Identity(tenant, principal)
        deleted = a.turns.deleted_conversations(tenant, principal)
        for text in _queries(rng):
            for page_size in PAGE_SIZES:
                what = f"{stage} {tenant}/{principal} {text!r} page {page_size}"
                hits_a = a.search.search(who, text, page_size)
                hits_b = b.search.search(who, text, page_size)
                assert not {h.conversation_id for h in hits_a} & deleted, what
                _assert_same_ranking(what, _fused(hits_a), _fused(hits_b), page_size)
                compared += len(hits_a)
            # Bounded: a random conversation (or none) and a random span of the times' grid.
            bounds = _bounds(rng)
            what = f"{stage} {tenant}/{principal} {text!r} within {bounds}"
            hits_a = a.search.search(who, text, 5, bounds=bounds)
            hits_b = b.search.search(who, text, 5, bounds=bounds)
            assert all(_within(h, bounds) for h in hits_a), what
            _assert_same_ranking(what, _fused(hits_a), _fused(hits_b), 5)
            compared += len(hits_a)
            # Below the fusion: each side's per-turn reduction, cut at a few turns.
            query = EncodedQuery(
                dense=a.embedder.embed_query(text), sparse=a.keywords.encode_query(text)
            )
            scope = SearchScope(tenant, principal, deleted)
            for turns in (1, 5):
                side_a, side_b = (
                    a.index.search(scope, query, turns),
                    b.index.search(scope, query, turns),
                )
                for name in ("keyword", "semantic"):
                    what = f"{stage} {tenant}/{principal} {text!r} {name} side, {turns} turns"
                    _assert_same_ranking(
                        what,
                        _side(getattr(side_a, name)),
                        _side(getattr(side_b, name)),
                        turns,
                    )
    return compared


# --- The test ------------------------------------------------------------------------------


@pytest.mark.parametrize("seed", [1, 2, 3, 4])
def test_the_engines_return_the_same_turns_in_the_same_order(
    seed: int, services: tuple[Service, Service]
) -> None:
    rng = random.Random(seed)
    a, b = services
    sent: list[tuple[Identity, str, str]] = []
    for tenant, principal in PRINCIPALS:
        who = Identity(tenant, principal)
        for n in range(rng.randint(12, 30)):
            conversation = rng.choice(CONVERSATIONS)
            turn_id = f"turn-{n}"
            # Times on a coarse grid: equal times happen, as they do when a client sends a
            # conversation's turns with one timestamp.
            when = T0 + timedelta(minutes=5 * rng.randrange(40))
            question, answer = _turn_text(rng)
            for service in (a, b):
                service.intake.index_turn(
                    who, conversation, turn_id, question, answer, when, wait=True
                )
            sent.append((who, conversation, turn_id))
    # Some turns sent again with other text (a long turn may come back shorter).
    for who, conversation, turn_id in rng.sample(sent, k=len(sent) // 10):
        question, answer = _turn_text(rng)
        when = T0 + timedelta(minutes=5 * rng.randrange(40))
        for service in (a, b):
            service.intake.index_turn(who, conversation, turn_id, question, answer, when, wait=True)

    compared = _compare_searches(rng, a, b, "indexed")

    # Deleted conversations leave search at once (the scope's filter), then their chunks go.
    for tenant, principal in PRINCIPALS:
        gone = rng.choice(CONVERSATIONS)
        for service in (a, b):
            service.removal.delete_conversation(Identity(tenant, principal), gone)
    compared += _compare_searches(rng, a, b, "deleted")
    assert a.indexer.purge_once(100) == b.indexer.purge_once(100) == len(PRINCIPALS)
    compared += _compare_searches(rng, a, b, "purged")

    # An erased principal is gone; the one of the same id in the other tenant is not.
    tenant, principal = rng.choice(PRINCIPALS)
    for service in (a, b):
        service.removal.erase(Identity(tenant, principal), principal)
    assert a.index.count(tenant, principal) == b.index.count(tenant, principal) == 0
    compared += _compare_searches(rng, a, b, "erased")
    assert compared > 500  # the data gave the comparison something to compare
