"""Conversation search: accepting turns, indexing them, searching, deleting and erasing.

Rules (DESIGN 3): a finished turn is accepted durably, with its credentials replaced by
placeholders (server/domain/secrets.py), and indexed by a background processor (or in the
call, when the caller waits for it); its text is split without any LLM into at most
ten chunks of at most 4,000 characters; each chunk gets a semantic (dense, windowed) and a
keyword (BM25) vector, the keyword one of the turn's date and the text (keywords.py). A search
runs both retrievals over the caller's own chunks, fuses them by weighted normalized score
fusion (see `fuse`) and keeps the best chunk per turn. A deleted conversation is out of
every search from the moment its tombstone commits, and a late turn cannot bring it back. An
erasure removes everything of a principal except the counts in the audit log. With memory
off, turns are not stored and search finds nothing.
"""

from __future__ import annotations

import enum
import logging
import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta

from server.domain.chunking import split_text, turn_text
from server.domain.context import KeywordContext
from server.domain.conversations import accept_turn, delete_conversation, erase_principal
from server.domain.errors import (
    ConversationDeleted,
    ErrorReason,
    FieldViolation,
    MemoriaError,
    invalid,
)
from server.domain.ids import identity_value_problem
from server.domain.keywords import (
    CONTEXT_FREE_VERSION,
    KEYWORD_VERSION,
    KeywordEncoder,
    keyword_document,
)
from server.domain.model import (
    EVERYONE,
    AcceptOutcome,
    AuditAction,
    ChunkHit,
    ChunkPlace,
    ClaimedTurn,
    EncodedQuery,
    Erasure,
    Identity,
    IndexedChunk,
    InspectedHit,
    NewAuditEvent,
    NewTurn,
    Owner,
    RetrievalResult,
    SearchHit,
    SearchRecord,
    SearchScope,
    SparseVector,
    StoredChunk,
    TurnKey,
    TurnRef,
    Writer,
)
from server.domain.ports import (
    ChunkIndex,
    Clock,
    Embedder,
    InspectionStore,
    MemoryStore,
    TurnBatch,
    TurnStore,
    UnitsOfWork,
)
from server.domain.secrets import SecretDetector, redact_secrets
from server.domain.text import sanitize

log = logging.getLogger(__name__)

DEFAULT_PAGE_SIZE = 10
MAX_PAGE_SIZE = 50
KEYWORD_WEIGHT = 0.8
"""Share of the keyword side in the fused score; the semantic side has the rest.

Chosen on real conversations (bench/search_levers.py over the four LoCoMo development files,
leave-one-conversation-out, criterion: the mean of recall@1/5/10 and MRR@10): with the keyword
side's neighbouring-chunk context (keyword representation 3), every held-out file's choice
from the other three was 0.8 (of 0.6-0.9), for the default model; with multilingual-e5-small,
0.7 and 0.8 both meet the issue's targets. The keyword side is the stronger one there
(recall@1 0.48 against 0.23 for all-MiniLM-L6-v2) and its scores separate the answer from the
rest more sharply; an equal share let the weaker side's near-ties push good keyword hits
down. Before the context (representation 2) 0.7 was best."""

MIN_RETRIEVAL_TURNS = 50
"""Each side contributes its top turns (the turns wanted, at least this many) to the fusion.

The fused score of a side is min-max normalized over this list, so its depth sets what "the
side's worst" is: 20 and 50 measured alike (LoCoMo, bench/search_levers.py), 10 worse
(recall@10 0.79 against 0.82-0.83: a turn one side ranks 11th still helps when the other
ranks it high). Reciprocal rank fusion measured worse at every depth, because it throws the
scores away: a keyword hit far ahead of the rest counts the same as a near-tie."""

ID_MAX_CHARS = 128
QUERY_MAX_CHARS = 4000
MAX_INDEX_ATTEMPTS = 8
"""A turn that fails this many times is recorded as failed and no longer retried."""
MAX_RETRY_DELAY = timedelta(minutes=5)
OUTAGE_RETRY_DELAY = timedelta(seconds=30)
"""The longest a turn waits between tries while the chunk index is unreachable
(STORE_UNAVAILABLE). An outage is not the turn's fault: it never makes a turn give up (with
MAX_INDEX_ATTEMPTS alone, an outage of about four minutes, 2+4+...+128 s of retries, marked
every waiting turn failed for good), and the short cap has the backlog indexed soon after
the store is back."""


class TurnOutcome(enum.Enum):
    """What IndexTurn did (the contract's IndexTurnOutcome)."""

    ACCEPTED = "accepted"
    INDEXED = "indexed"
    SKIPPED_MEMORY_DISABLED = "skipped_memory_disabled"


@dataclass(frozen=True)
class IndexTurnResult:
    """How a turn was taken, with its chunking."""

    outcome: TurnOutcome
    chunk_count: int
    truncated: bool
    indexed_char_count: int


def fuse(result: RetrievalResult, turns: int) -> list[SearchHit]:
    """Weighted normalized score fusion of the two per-turn rankings, best first, at most
    `turns`.

    Each side's raw scores are min-max normalized over its list (its best turn 1, its last
    0; a side whose scores are all equal gives each 1), and a turn's score is
    KEYWORD_WEIGHT times its keyword value plus the rest times its semantic value (0 on a
    side that did not list it). A side with no hits adds nothing, so one side alone ranks as
    that side does. The chunk shown is the one the side ranking the turn higher chose
    (keyword on a tie: an exact match is the easier one for a person to recognize).
    """
    weights = {"keyword": KEYWORD_WEIGHT, "semantic": 1.0 - KEYWORD_WEIGHT}
    by_turn: dict[tuple[str, str], dict[str, tuple[int, float, ChunkHit]]] = {}
    for side, hits in (("keyword", result.keyword), ("semantic", result.semantic)):
        for rank, (hit, value) in enumerate(zip(hits, _min_max(hits), strict=True), start=1):
            entry = (rank, value, hit)
            by_turn.setdefault((hit.conversation_id, hit.turn_id), {}).setdefault(side, entry)
    fused: list[SearchHit] = []
    for sides in by_turn.values():
        keyword_rank = sides["keyword"][0] if "keyword" in sides else 0
        semantic_rank = sides["semantic"][0] if "semantic" in sides else 0
        _, _, chunk = min(sides.values(), key=lambda entry: entry[0])
        score = sum(weights[side] * value for side, (_, value, _) in sides.items())
        fused.append(
            SearchHit(
                conversation_id=chunk.conversation_id,
                turn_id=chunk.turn_id,
                chunk_index=chunk.chunk_index,
                text=chunk.text,
                turn_time=chunk.turn_time,
                score=score,
                keyword_rank=keyword_rank,
                semantic_rank=semantic_rank,
            )
        )
    # Ties go to the turn with the better single rank on either side, then a stable order.
    fused.sort(
        key=lambda h: (
            -h.score,
            min(r for r in (h.keyword_rank, h.semantic_rank) if r),
            h.conversation_id,
            h.turn_id,
        )
    )
    return fused[:turns]


def _min_max(hits: Sequence[ChunkHit]) -> list[float]:
    """Each hit's raw score mapped to 0..1 over the list (all 1 when they are all equal)."""
    if not hits:
        return []
    low = min(h.score for h in hits)
    span = max(h.score for h in hits) - low
    return [(h.score - low) / span if span > 0 else 1.0 for h in hits]


class OneSideIndex:
    """A chunk index whose searches return one retrieval side only (the other empty).

    For development and benchmarks (the `search_mode` setting): `fuse` over one side ranks
    exactly as that side does, so a search answers keyword-only or semantic-only with the
    same index, the same representations and the same per-turn reduction as hybrid search.
    Every other operation passes through unchanged.
    """

    def __init__(self, index: ChunkIndex, side: str) -> None:
        if side not in ("keyword", "semantic"):
            raise ValueError(f"side must be keyword or semantic, not {side!r}")
        self._index = index
        self._side = side

    def search(self, scope: SearchScope, query: EncodedQuery, turns: int) -> RetrievalResult:
        """The wrapped index's result with the other side emptied."""
        result = self._index.search(scope, query, turns)
        if self._side == "keyword":
            return RetrievalResult(keyword=result.keyword, semantic=())
        return RetrievalResult(keyword=(), semantic=result.semantic)

    def upsert_turn(
        self, key: TurnKey, turn_time: datetime, chunks: Sequence[IndexedChunk]
    ) -> None:
        """Passed through."""
        self._index.upsert_turn(key, turn_time, chunks)

    def stale_keyword_chunks(
        self, version: int, limit: int, owner: Owner = EVERYONE
    ) -> Sequence[StoredChunk]:
        """Passed through."""
        return self._index.stale_keyword_chunks(version, limit, owner)

    def count_stale_keyword_chunks(self, version: int, owner: Owner = EVERYONE) -> int:
        """Passed through."""
        return self._index.count_stale_keyword_chunks(version, owner)

    def set_keyword_vectors(
        self, updates: Sequence[tuple[StoredChunk, SparseVector]], version: int
    ) -> None:
        """Passed through."""
        self._index.set_keyword_vectors(updates, version)

    def delete_conversation(self, tenant_id: str, principal_id: str, conversation_id: str) -> None:
        """Passed through."""
        self._index.delete_conversation(tenant_id, principal_id, conversation_id)

    def delete_principal(self, tenant_id: str, principal_id: str) -> None:
        """Passed through."""
        self._index.delete_principal(tenant_id, principal_id)

    def count(self, tenant_id: str, principal_id: str, conversation_id: str | None = None) -> int:
        """Passed through."""
        return self._index.count(tenant_id, principal_id, conversation_id)

    def turn_chunks(
        self, tenant_id: str, principal_id: str, turns: Sequence[tuple[str, str]]
    ) -> dict[tuple[str, str], tuple[str, ...]]:
        """Passed through."""
        return self._index.turn_chunks(tenant_id, principal_id, turns)

    def conversation_places(
        self, tenant_id: str, principal_id: str, conversation_id: str
    ) -> Sequence[ChunkPlace]:
        """Passed through."""
        return self._index.conversation_places(tenant_id, principal_id, conversation_id)

    def places_near(
        self,
        tenant_id: str,
        principal_id: str,
        conversation_id: str,
        turn_time: datetime,
        limit: int,
    ) -> tuple[Sequence[ChunkPlace], Sequence[ChunkPlace]]:
        """Passed through."""
        return self._index.places_near(tenant_id, principal_id, conversation_id, turn_time, limit)

    def check(self) -> None:
        """Passed through."""
        self._index.check()

    def close(self) -> None:
        """Passed through."""
        self._index.close()


def search_index(index: ChunkIndex, mode: str) -> ChunkIndex:
    """The index searches run on: `index` itself for hybrid, else a OneSideIndex."""
    if mode == "hybrid":
        return index
    return OneSideIndex(index, mode)


class Indexer:
    """Turns queued turns into chunks in the index, and purges deleted conversations.

    Used by the background worker (in the server process or `memoria worker`) and by
    IndexTurn calls that wait. Safe to run in several threads and processes at once: the turn
    store's claims keep two processors off the same turn.
    """

    def __init__(
        self,
        turns: TurnStore,
        index: ChunkIndex,
        embedder: Embedder,
        keywords: KeywordEncoder,
        clock: Clock,
        *,
        max_attempts: int = MAX_INDEX_ATTEMPTS,
    ) -> None:
        self._turns = turns
        self._index = index
        self._embedder = embedder
        self._keywords = keywords
        self._context = KeywordContext(index, keywords)
        self._clock = clock
        self._max_attempts = max_attempts

    def run_once(self, limit: int) -> int:
        """Index up to `limit` due turns; return how many were claimed."""
        with self._turns.claim(limit, self._clock()) as batch:
            self._process(batch)
            return len(batch.turns)

    def index_now(self, key: TurnKey) -> bool:
        """Index one turn now (waiting for another processor holding it); True once it is
        searchable, False if it is gone (deleted or erased meanwhile). If indexing fails the
        turn stays queued for the worker and STORE_UNAVAILABLE is raised."""
        with self._turns.claim(1, self._clock(), only=key) as batch:
            if not batch.turns:
                return False
            if self._process(batch) == len([t for t in batch.turns if t.text is not None]):
                return True
        raise MemoriaError(
            ErrorReason.STORE_UNAVAILABLE,
            "the turn is stored, but it could not be indexed now; the worker retries it in "
            "the background. Send it again to wait for it once more.",
        )

    def purge_once(self, limit: int) -> int:
        """Remove the chunks of up to `limit` deleted conversations from the index."""
        with self._turns.claim_purges(limit) as purges:
            for purge in purges:
                self._index.delete_conversation(
                    purge.tenant_id, purge.principal_id, purge.conversation_id
                )
            return len(purges)

    def _process(self, batch: TurnBatch) -> int:
        """Chunk and embed the batch's turns together (one model batch), then store each;
        return how many were indexed. A turn without text is already indexed (claimed by key
        after another processor)."""
        chunked = [(t, split_text(t.text).chunks) for t in batch.turns if t.text is not None]
        if chunked:
            log.debug("indexing turns %s", [t.row_id for t, _ in chunked])
        try:
            texts = [chunk for _, chunks in chunked for chunk in chunks]
            vectors = iter(self._embedder.embed_documents(texts))
        except Exception as error:  # the model failed for the whole batch: retry each turn
            for turn, _ in chunked:
                self._failed(batch, turn, error)
            return 0
        indexed_turns = 0
        for turn, chunks in chunked:
            # Written first with its own words only (searchable at once, and marked as such),
            # then it and its neighbours are encoded with their context, read back from the
            # index (server/domain/context.py). A failure in between leaves the turn queued.
            indexed = [
                IndexedChunk(
                    chunk_index=i,
                    text=text,
                    dense=next(vectors),
                    sparse=self._keywords.encode_document(keyword_document(text, turn.turn_time)),
                    keyword_version=CONTEXT_FREE_VERSION,
                    turn_order=turn.row_id,
                )
                for i, text in enumerate(chunks)
            ]
            try:
                self._index.upsert_turn(turn.key, turn.turn_time, indexed)
                self._index.set_keyword_vectors(
                    self._context.turn_updates(turn.key, turn.turn_time), KEYWORD_VERSION
                )
            except Exception as error:
                self._failed(batch, turn, error)
                continue
            batch.indexed(turn)
            indexed_turns += 1
        return indexed_turns

    def _failed(self, batch: TurnBatch, turn: ClaimedTurn, error: Exception) -> None:
        attempts = turn.attempts + 1
        # Only the exception type: messages of storage errors may quote the turn's text.
        reason = type(error).__name__
        outage = isinstance(error, MemoriaError) and error.reason is ErrorReason.STORE_UNAVAILABLE
        if attempts >= self._max_attempts and not outage:
            log.error("turn %s failed %d times (%s); giving up", turn.row_id, attempts, reason)
            batch.failed(turn, reason, None)
            return
        cap = OUTAGE_RETRY_DELAY if outage else MAX_RETRY_DELAY
        delay = min(timedelta(seconds=2 ** min(attempts, 16)), cap)
        jitter = timedelta(seconds=random.uniform(0, delay.total_seconds() / 4))
        log.warning("turn %s failed (%s); retry %d in %s", turn.row_id, reason, attempts, delay)
        batch.failed(turn, reason, self._clock() + delay + jitter)


class ConversationSearch:
    """The conversation search operations for authenticated callers."""

    def __init__(
        self,
        turns: TurnStore,
        index: ChunkIndex,
        embedder: Embedder,
        keywords: KeywordEncoder,
        memory: MemoryStore,
        indexer: Indexer,
        clock: Clock,
        units: UnitsOfWork,
        *,
        wake_worker: Callable[[], None] = lambda: None,
        secrets: SecretDetector | None = None,
        inspections: InspectionStore | None = None,
    ) -> None:
        """`secrets` finds the credentials replaced in every turn before it is stored
        (server/domain/secrets.py); None replaces nothing (unit tests of other rules).
        `inspections` records the searches made for a named turn (server/domain/inspection.py);
        None records nothing. `units` opens the units of work that accepting, deleting and
        erasing run on (server/domain/conversations.py)."""
        self._inspections = inspections
        self._units = units
        self._turns = turns
        self._index = index
        self._embedder = embedder
        self._keywords = keywords
        self._memory = memory
        self._indexer = indexer
        self._clock = clock
        self._wake_worker = wake_worker
        self._secrets = secrets

    def index_turn(
        self,
        who: Identity,
        conversation_id: str,
        turn_id: str,
        question: str,
        answer: str,
        turn_time: datetime | None,
        *,
        wait: bool = False,
    ) -> IndexTurnResult:
        """Accept a finished turn durably; index it now when `wait`, else in the background."""
        violations = [
            *_id_violations("conversation_id", conversation_id),
            *_id_violations("turn_id", turn_id),
        ]
        if turn_time is None:
            violations.append(FieldViolation("turn_time", "is required"))
        # Credentials are replaced before the turn is queued, so neither the queue nor the
        # index nor a search result ever holds one.
        text = redact_secrets(self._secrets, turn_text(question, answer))
        if not text:
            violations.append(
                FieldViolation("question", "question and answer are both empty after sanitizing")
            )
        if violations:
            raise invalid(*violations)
        assert turn_time is not None
        chunked = split_text(text)
        key = TurnKey(who.tenant_id, who.principal_id, conversation_id, turn_id)
        indexed_text = chunked.indexed_text
        outcome = accept_turn(
            self._units,
            NewTurn(key=key, text=indexed_text, turn_time=turn_time, accept_time=self._clock()),
        )
        if outcome is AcceptOutcome.CONVERSATION_DELETED:
            raise MemoriaError(
                ErrorReason.CONVERSATION_DELETED,
                "this conversation was deleted, so its turns are no longer accepted; "
                "use a new conversation id",
                details=ConversationDeleted(conversation_id),
            )
        if outcome is AcceptOutcome.MEMORY_DISABLED:
            return IndexTurnResult(TurnOutcome.SKIPPED_MEMORY_DISABLED, 0, False, 0)
        result = TurnOutcome.ACCEPTED
        if wait and self._indexer.index_now(key):
            result = TurnOutcome.INDEXED
        elif not wait:
            self._wake_worker()
        return IndexTurnResult(result, len(chunked.chunks), chunked.truncated, len(indexed_text))

    def search(
        self, who: Identity, query: str, page_size: int, turn: TurnRef | None = None
    ) -> list[SearchHit]:
        """The caller's best-matching turns for `query`, best first (see `fuse`). With `turn`,
        the query and the hits' ids and ranks are recorded for that turn (the inspector)."""
        hits = self._search(who, query, page_size, turn)
        if turn is not None and self._inspections is not None:
            key = TurnKey(who.tenant_id, who.principal_id, turn.conversation_id, turn.turn_id)
            record = SearchRecord(
                query=sanitize(query),
                record_time=self._clock(),
                hits=tuple(
                    InspectedHit(
                        conversation_id=h.conversation_id,
                        turn_id=h.turn_id,
                        chunk_index=h.chunk_index,
                        turn_time=h.turn_time,
                        score=h.score,
                        keyword_rank=h.keyword_rank,
                        semantic_rank=h.semantic_rank,
                    )
                    for h in hits
                ),
            )
            self._inspections.record_search(key, record)
        return hits

    def _search(
        self, who: Identity, query: str, page_size: int, turn: TurnRef | None
    ) -> list[SearchHit]:
        text = sanitize(query)
        violations = [] if turn is None else turn_reference_violations(turn)
        if not text:
            violations.append(FieldViolation("query", "must not be empty"))
        elif len(text) > QUERY_MAX_CHARS:
            violations.append(
                FieldViolation("query", f"has {len(text)} characters; at most {QUERY_MAX_CHARS}")
            )
        if page_size < 0:
            violations.append(FieldViolation("page_size", "must not be negative"))
        if violations:
            raise invalid(*violations)
        turns = min(page_size or DEFAULT_PAGE_SIZE, MAX_PAGE_SIZE)
        if not self._memory.read(who.tenant_id, who.principal_id).memory_enabled:
            return []
        scope = SearchScope(
            who.tenant_id,
            who.principal_id,
            self._turns.deleted_conversations(who.tenant_id, who.principal_id),
        )
        encoded = EncodedQuery(
            dense=self._embedder.embed_query(text), sparse=self._keywords.encode_query(text)
        )
        depth = max(turns, MIN_RETRIEVAL_TURNS)
        return fuse(self._index.search(scope, encoded, depth), turns)

    def delete_conversation(self, who: Identity, conversation_id: str) -> int:
        """Take one of the caller's conversations out of search for good; see the module."""
        violations = _id_violations("conversation_id", conversation_id)
        if violations:
            raise invalid(*violations)
        event = NewAuditEvent(
            principal_id=who.principal_id,
            action=AuditAction.CONVERSATION_DELETED,
            writer=Writer.USER,
            create_time=self._clock(),
            conversation_id=conversation_id,
            actor_principal_id=who.principal_id,
        )
        deleted = delete_conversation(
            self._units, who.tenant_id, who.principal_id, conversation_id, event
        )
        if deleted is not None:
            self._wake_worker()  # the purge of its chunks
        return deleted or 0

    def erase(self, who: Identity, principal_id: str) -> Erasure:
        """Erase all of a principal's memory: its own, or (administrators) another's."""
        target = principal_id or who.principal_id
        # A principal id, so the identity rule that authentication applies (not the
        # conversation-id rule): every principal that can call the service can erase itself.
        problem = identity_value_problem(target)
        if problem is not None:
            raise invalid(FieldViolation("principal_id", problem))
        if target != who.principal_id and not who.is_tenant_admin:
            raise MemoriaError(
                ErrorReason.PERMISSION_DENIED,
                "erasing another principal's data requires the tenant administrator role",
            )
        event = NewAuditEvent(
            principal_id=target,
            action=AuditAction.PRINCIPAL_DATA_ERASED,
            writer=Writer.USER,
            create_time=self._clock(),
            actor_principal_id=who.principal_id,
        )
        if self._inspections is not None:
            self._inspections.flush()  # no record made before the erasure may outlive it
        return erase_principal(
            self._units,
            who.tenant_id,
            target,
            event,
            purge=lambda: self._index.delete_principal(who.tenant_id, target),
        )


def turn_reference_violations(turn: TurnRef) -> list[FieldViolation]:
    """A turn reference's ids follow the rule of IndexTurn's ids (fields `turn.*`)."""
    return [
        *_id_violations("turn.conversation_id", turn.conversation_id),
        *_id_violations("turn.turn_id", turn.turn_id),
    ]


def _id_violations(field: str, value: str) -> list[FieldViolation]:
    """An id is 1 to ID_MAX_CHARS code points with no control or invisible characters."""
    if not value:
        return [FieldViolation(field, "is required")]
    if len(value) > ID_MAX_CHARS:
        return [FieldViolation(field, f"has {len(value)} characters; at most {ID_MAX_CHARS}")]
    if sanitize(value) != value or "\n" in value or "\t" in value:
        return [
            FieldViolation(
                field,
                "must not contain control or invisible characters or surrounding whitespace",
            )
        ]
    return []
