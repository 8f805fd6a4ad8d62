"""Conversation search: a caller's best-matching turns for a query.

Rules (DESIGN 3): a search runs both retrievals (keyword and semantic) over the caller's own
chunks, fuses them by weighted normalized score fusion (server/domain/fusion.py) and keeps
the best chunk per turn, and only turns that share something real with the query: a search
with no strong match answers nothing (server/domain/relevance.py). A deleted conversation is
out of every search from the moment its tombstone commits (its chunks may still wait for
their purge: the search leaves them out).
With memory off, search finds nothing. A search that names the turn it is made for is
recorded for the inspector (server/domain/inspection.py).

A caller may bound a search (`SearchBounds`: one conversation, turns at or after a start time,
turns before an end time; DESIGN 3, "what did we decide last week"). The bounds travel to the
chunk index inside the scope and are applied there as payload filters on both retrieval sides,
never to the fused list: a side's top list is cut at its depth, so filtering afterwards would
lose the in-bounds turns ranked below the cut. An empty span (end not after start) is the
caller's mistake, refused like any invalid field.

The tenant's turn retention (server/domain/retention.py) narrows the caller's bounds: its
cutoff becomes the start time when it is later than the caller's, so an expired turn is out of
every search at once, purged or not.
"""

from __future__ import annotations

import functools
import math
import operator
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field

from server.domain.context import dense_context_weight
from server.domain.errors import FieldViolation, invalid
from server.domain.fusion import fuse, keyword_weight, retrieval_depth
from server.domain.ids import id_violations, turn_reference_violations
from server.domain.keywords import KeywordEncoder
from server.domain.model import (
    EncodedQuery,
    Identity,
    InspectedHit,
    SearchBounds,
    SearchHit,
    SearchRecord,
    SearchScope,
    TurnKey,
    TurnRef,
)
from server.domain.ports import (
    ChunkSearch,
    Clock,
    DenseVectors,
    Embedder,
    InspectionStore,
    MemoryStore,
    TurnStore,
)
from server.domain.relevance import Relevance, query_floor
from server.domain.retention import KEEP_EVERYTHING, TurnRetention
from server.domain.text import sanitize

DEFAULT_PAGE_SIZE = 10
MAX_PAGE_SIZE = 50
QUERY_MAX_CHARS = 4000


@dataclass(frozen=True)
class ConversationSearch:
    """SearchConversations for authenticated callers.

    `memory` tells whether the caller's memory is on; `turns` which of its conversations are
    deleted; `chunks` runs the retrieval on the query `embedder` and `keywords` encode.
    `inspections` records the searches made for a named turn; None records nothing.
    `retention` hides the tenant's expired turns. `gated` applies the relevance gate
    (server/domain/relevance.py); off only for the development one-side search modes, which
    measure one side's ranking alone (the gate reads both sides).
    """

    memory: MemoryStore
    turns: TurnStore
    embedder: Embedder
    keywords: KeywordEncoder
    chunks: ChunkSearch
    clock: Clock
    inspections: InspectionStore | None = None
    retention: TurnRetention = KEEP_EVERYTHING
    gated: bool = True
    windows: DenseVectors | None = None
    _empty: dict[str, tuple[float, ...]] = field(
        default_factory=dict, init=False, repr=False, compare=False
    )

    def search(
        self,
        who: Identity,
        query: str,
        page_size: int,
        turn: TurnRef | None = None,
        bounds: SearchBounds | None = None,
    ) -> list[SearchHit]:
        """The caller's best-matching turns for `query` within `bounds` (None: everywhere),
        best first (see `fuse`). With `turn`, the query and the hits' ids and ranks are
        recorded for that turn (the inspector)."""
        bounds = bounds or SearchBounds()
        hits = self._search(who, query, page_size, turn, bounds)
        if turn is not None and self.inspections is not None:
            key = TurnKey(who.tenant_id, who.principal_id, turn.conversation_id, turn.turn_id)
            record = SearchRecord(
                query=sanitize(query),
                record_time=self.clock(),
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
                bounds=bounds,  # as the caller gave them (the retention's cutoff is not theirs)
            )
            self.inspections.record_search(key, record)
        return hits

    def _empty_passage(self) -> tuple[float, ...]:
        """The embedder's vector of an empty passage (relevance.FLOORS_OVER_EMPTY), embedded
        once per model."""
        model = self.embedder.model_id
        if model not in self._empty:
            (first, *_) = self.embedder.embed_documents([""])[0]
            self._empty[model] = first
        return self._empty[model]

    def _search(
        self,
        who: Identity,
        query: str,
        page_size: int,
        turn: TurnRef | None,
        bounds: SearchBounds,
    ) -> list[SearchHit]:
        text = sanitize(query)
        violations = [] if turn is None else turn_reference_violations(turn)
        violations += bounds_violations(bounds)
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
        if not self.memory.read(who.tenant_id, who.principal_id).memory_enabled:
            return []
        bounds = self.retention.bounded(who.tenant_id, self.clock(), bounds)
        start, end = bounds.start_time, bounds.end_time
        if start is not None and end is not None and start >= end:
            return []  # the caller's span ends before the retention's cutoff
        scope = SearchScope(
            who.tenant_id,
            who.principal_id,
            self.turns.deleted_conversations(who.tenant_id, who.principal_id),
            bounds,
        )
        encoded = EncodedQuery(
            dense=self.embedder.embed_query(text), sparse=self.keywords.encode_query(text)
        )
        depth = retrieval_depth(turns)
        model = self.embedder.model_id
        found = self.chunks.search(scope, encoded, depth)
        fused = fuse(found, 2 * depth, keyword_weight(model))  # every turn found
        floor = query_floor(model, encoded.dense, self._empty_passage) if self.gated else None
        windows = None
        if self.windows is not None and dense_context_weight(model) is not None:
            windows = functools.partial(self._window_similarity, who, encoded.dense)
        relevance = Relevance(self.keywords, floor, windows)
        return relevance.page(text, fused, turns)

    def _window_similarity(
        self, who: Identity, query: tuple[float, ...], hits: Sequence[SearchHit]
    ) -> dict[tuple[str, str], float]:
        """Each hit's cosine to the windows alone of the chunk the semantic side found (its
        context vector left out: relevance.Relevance's `windows`), read in one call per
        conversation; a hit whose chunk is gone (deleted meanwhile) is left out."""
        assert self.windows is not None
        places: dict[str, list[tuple[str, int]]] = defaultdict(list)
        for hit in hits:
            if hit.semantic_chunk is not None:
                places[hit.conversation_id].append((hit.turn_id, hit.semantic_chunk))
        similarity: dict[tuple[str, str], float] = {}
        for conversation, wanted in places.items():
            found = self.windows.chunk_windows(
                who.tenant_id, who.principal_id, conversation, wanted
            )
            for (turn, _), vectors in found.items():
                similarity[conversation, turn] = max(
                    math.fsum(map(operator.mul, query, vector)) for vector in vectors
                )
        return similarity


def bounds_violations(bounds: SearchBounds) -> list[FieldViolation]:
    """What is wrong with a search's bounds, named by field: a conversation id must follow the
    id rule (server/domain/ids.py), and a span with both ends must not be empty (`end_time`
    after `start_time`). Times must be timezone-aware (the transports make them so)."""
    violations: list[FieldViolation] = []
    if bounds.conversation_id is not None:
        violations += id_violations("conversation_id", bounds.conversation_id)
    start, end = bounds.start_time, bounds.end_time
    naive = [
        FieldViolation(field, "must include a time zone")
        for field, moment in (("start_time", start), ("end_time", end))
        if moment is not None and moment.utcoffset() is None
    ]
    violations += naive
    if start is not None and end is not None and not naive and start >= end:
        violations.append(FieldViolation("end_time", "must be after start_time"))
    return violations
