"""Spans and metrics around the ports, put in place by the composition root (through
`Telemetry`), so no adapter knows about telemetry: a client span per chunk index (Qdrant) call
with the indexing counters, a span per embedding call, the size of each block a rewrite wrote,
and one trace per batch of the background indexer's work."""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import AbstractContextManager, ExitStack, contextmanager
from datetime import datetime
from typing import Any, TypeVar

from opentelemetry import metrics, trace
from opentelemetry.instrumentation.utils import suppress_instrumentation
from opentelemetry.trace import SpanKind

from server.domain.model import (
    AuditAction,
    AuditEvent,
    AuditQuery,
    Change,
    ConversationPurge,
    ExpiryCutoffs,
    IndexedChunk,
    PrincipalMemory,
    SparseVector,
    StoredChunk,
    StoredTurn,
    Tombstone,
    TurnKey,
)
from server.domain.ports import ChunkIndex, Embedder, MemoryStore, TurnBatch, TurnStore

T = TypeVar("T")


class TracedChunkIndex:
    """A `ChunkIndex` with a client span per Qdrant call, counting what upserts index.

    Generic: every operation of the index is traced under its own name, so an operation added
    to the ports (server/domain/ports.py) is traced with no change here. Only what a span
    alone does not say is written out: the counters of `upsert_turn` and the chunk count of
    the two writes. `UNTRACED` operations pass straight through.
    """

    UNTRACED = frozenset({"check", "close"})
    """The health monitor's probe (a trace every few seconds is noise) and the shutdown."""

    def __init__(self, index: ChunkIndex, tracer: trace.Tracer, meter: metrics.Meter, engine: str):
        self._index = index
        self._tracer = tracer
        self._attributes = {"db.system.name": "qdrant", "memoria.qdrant.engine": engine}
        self._turns = meter.create_counter(
            "memoria.index.turns", unit="{turn}", description="Turns written to the chunk index"
        )
        self._chunks = meter.create_counter(
            "memoria.index.chunks",
            unit="{chunk}",
            description="Chunks written to the chunk index",
        )

    def _span(self, operation: str) -> AbstractContextManager[trace.Span]:
        return self._tracer.start_as_current_span(
            f"qdrant {operation}",
            kind=SpanKind.CLIENT,
            attributes={**self._attributes, "db.operation.name": operation},
        )

    def __getattr__(self, operation: str) -> Any:
        """The index's own `operation`, run in a span of its name (unless UNTRACED)."""
        member = getattr(self._index, operation)
        if operation.startswith("_") or operation in self.UNTRACED or not callable(member):
            return member

        @functools.wraps(member)
        def traced(*args: Any, **kwargs: Any) -> Any:
            with self._span(operation):
                return member(*args, **kwargs)

        return traced

    def upsert_turn(
        self, key: TurnKey, turn_time: datetime, chunks: Sequence[IndexedChunk]
    ) -> None:
        with self._span("upsert_turn") as span:
            span.set_attribute("memoria.chunk_count", len(chunks))
            self._index.upsert_turn(key, turn_time, chunks)
        self._turns.add(1)
        self._chunks.add(len(chunks))

    def set_keyword_vectors(
        self, updates: Sequence[tuple[StoredChunk, SparseVector]], version: int
    ) -> None:
        with self._span("set_keyword_vectors") as span:
            span.set_attribute("memoria.chunk_count", len(updates))
            self._index.set_keyword_vectors(updates, version)


class TracedEmbedder:
    """An `Embedder` with a span per call (the model runs in this process)."""

    def __init__(self, embedder: Embedder, tracer: trace.Tracer):
        self._embedder = embedder
        self._tracer = tracer

    @property
    def model_id(self) -> str:
        return self._embedder.model_id

    @property
    def dimension(self) -> int:
        return self._embedder.dimension

    def embed_documents(self, texts: Sequence[str]) -> list[tuple[tuple[float, ...], ...]]:
        with self._tracer.start_as_current_span(
            "embed documents",
            attributes={"memoria.text_count": len(texts), "memoria.char_count": _chars(texts)},
        ) as span:
            vectors = self._embedder.embed_documents(texts)
            span.set_attribute("memoria.window_count", sum(len(v) for v in vectors))
            return vectors

    def embed_query(self, text: str) -> tuple[float, ...]:
        with self._tracer.start_as_current_span(
            "embed query", attributes={"memoria.char_count": len(text)}
        ):
            return self._embedder.embed_query(text)


def _chars(texts: Iterable[str]) -> int:
    return sum(len(t) for t in texts)


class MeteredMemoryStore:
    """A `MemoryStore` that records the size of each block a rewrite wrote.

    Only `apply` is wrapped; reads go straight to the wrapped store's bound method, so the
    render path pays nothing for it.
    """

    def __init__(self, store: MemoryStore, meter: metrics.Meter):
        self._store = store
        self.read: Callable[..., PrincipalMemory] = store.read
        self.confirm: Callable[..., bool] = store.confirm
        self._sizes = meter.create_histogram(
            "memoria.block.size",
            unit="{char}",
            description="Characters (code points) of each block written by a rewrite",
            explicit_bucket_boundaries_advisory=(100, 250, 500, 1000, 1500, 2000, 3000, 4000),
        )

    def apply(self, tenant_id: str, change: Change) -> bool:
        applied = self._store.apply(tenant_id, change)
        if applied and change.event.action is AuditAction.BLOCK_REWRITTEN:
            self._sizes.record(change.event.char_count)
        return applied

    def list_audit(self, tenant_id: str, query: AuditQuery) -> list[AuditEvent]:
        return self._store.list_audit(tenant_id, query)


class TracedTurnStore:
    """The indexer's `TurnStore`: each batch of work becomes one trace, idle polls none.

    The background worker claims every second whether there is work or not. Outside any
    span (the worker's loop) its claim statements run with instrumentation suppressed, and a
    span is started only when the claim brought turns or purges: the embedding, Qdrant and
    SQL spans of the batch are its children. A claim made inside a span (an IndexTurn that
    waits) is traced as usual, as part of that call.
    """

    def __init__(self, turns: TurnStore, tracer: trace.Tracer):
        self._turns = turns
        self._tracer = tracer

    def claim(
        self, limit: int, now: datetime, only: TurnKey | None = None
    ) -> AbstractContextManager[TurnBatch]:
        claim = self._turns.claim(limit, now, only)
        return self._traced(claim, "index turns", lambda batch: len(batch.turns))

    def claim_purges(self, limit: int) -> AbstractContextManager[list[ConversationPurge]]:
        return self._traced(self._turns.claim_purges(limit), "purge conversations", len)

    @contextmanager
    def _traced(
        self, claim: AbstractContextManager[T], name: str, count: Callable[[T], int]
    ) -> Iterator[T]:
        background = not trace.get_current_span().get_span_context().is_valid
        with ExitStack() as stack:
            if background:
                with suppress_instrumentation():
                    work = stack.enter_context(claim)
            else:
                work = stack.enter_context(claim)
            items = count(work)
            if items or not background:
                span = stack.enter_context(self._tracer.start_as_current_span(name))
                span.set_attribute("memoria.item_count", items)
            yield work

    def deleted_conversations(self, tenant_id: str, principal_id: str) -> frozenset[str]:
        return self._turns.deleted_conversations(tenant_id, principal_id)

    def list_turns(
        self,
        tenant_id: str,
        principal_id: str,
        after_row_id: int,
        limit: int,
        since: datetime | None = None,
    ) -> list[StoredTurn]:
        return self._turns.list_turns(tenant_id, principal_id, after_row_id, limit, since)

    def expired_principals(self, cutoffs: ExpiryCutoffs, limit: int) -> list[tuple[str, str]]:
        """The retention purge's poll: like an idle claim, untraced in the worker's loop."""
        if trace.get_current_span().get_span_context().is_valid:
            return self._turns.expired_principals(cutoffs, limit)
        with suppress_instrumentation():
            return self._turns.expired_principals(cutoffs, limit)

    def list_tombstones(
        self, tenant_id: str, principal_id: str, offset: int, limit: int
    ) -> list[Tombstone]:
        return self._turns.list_tombstones(tenant_id, principal_id, offset, limit)
