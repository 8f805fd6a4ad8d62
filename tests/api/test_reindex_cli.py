"""`memoria reindex`: older chunks moved to the current keyword representation, to the end,
with progress; every tenant's, or one tenant's or principal's (`--only-tenant`,
`--only-principal`: a scope, never named like an identity).

Runs the real command on an embedded data directory written by an older release's layout
(keyword representation 1: the text alone, no recorded version).
"""

from __future__ import annotations

import subprocess
from datetime import UTC, datetime
from pathlib import Path

from server.adapters.qdrant.edge import QdrantEdgeChunkIndex
from server.domain.keywords import KEYWORD_VERSION, KeywordEncoder
from server.domain.model import EncodedQuery, IndexedChunk, Owner, SearchScope, TurnKey
from tests.api.conftest import shared_embedder
from tests.processes import MEMORIA, clean_env, failed_in_one_line

MAY = datetime(2023, 5, 8, 13, 56, tzinfo=UTC)


def old_store(data_dir: Path) -> None:
    """Three turns of ana's and one of bob's, as an older release wrote them."""
    embedder = shared_embedder()
    encoder = KeywordEncoder()
    index = QdrantEdgeChunkIndex(data_dir / "chunks", embedder.dimension, embedder.model_id)
    try:
        owners = [("t1", "ana", "u0"), ("t1", "ana", "u1"), ("t1", "ana", "u2"), ("t1", "bob", "b")]
        texts = ["we saw a heron", "it stood so still", "then an otter swam by", "a heron"]
        for (tenant, principal, turn), text in zip(owners, texts, strict=True):
            dense = embedder.embed_documents([text])[0]
            chunk = IndexedChunk(0, text, dense, encoder.encode_document(text))
            index.upsert_turn(TurnKey(tenant, principal, "c1", turn), MAY, [chunk])
    finally:
        index.close()


def reindex(data_dir: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(MEMORIA), "reindex", "--data-dir", str(data_dir), *args],
        env=clean_env(),
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_reindex_one_principal_then_everyone_with_progress(tmp_path: Path) -> None:
    data_dir = tmp_path / "data"
    old_store(data_dir)
    done = reindex(data_dir, "--only-tenant", "t1", "--only-principal", "ana")
    assert done.returncode == 0, done.stderr
    assert "memoria reindex: 0/3 chunks" in done.stderr
    assert "memoria reindex: 3/3 chunks" in done.stderr
    embedder = shared_embedder()
    index = QdrantEdgeChunkIndex(data_dir / "chunks", embedder.dimension, embedder.model_id)
    try:
        assert index.count_stale_keyword_chunks(KEYWORD_VERSION, Owner("t1", "ana")) == 0
        assert index.count_stale_keyword_chunks(KEYWORD_VERSION) == 1  # bob's is still old
        # The new representation: the date, and the neighbours' words (u1 holds "heron").
        encoder = KeywordEncoder()
        query = EncodedQuery(embedder.embed_query("x"), encoder.encode_query("heron May 2023"))
        hits = index.search(SearchScope("t1", "ana", frozenset()), query, 10).keyword
        assert [h.turn_id for h in hits][:2] == ["u0", "u1"]
    finally:
        index.close()
    everyone = reindex(data_dir)
    assert everyone.returncode == 0, everyone.stderr
    assert "memoria reindex: 1/1 chunks" in everyone.stderr
    again = reindex(data_dir)  # resumable: nothing left to do
    assert again.returncode == 0, again.stderr
    assert "memoria reindex: 0/0 chunks" in again.stderr


def test_reindex_refuses_a_principal_without_its_tenant_or_a_bad_id(tmp_path: Path) -> None:
    env = clean_env()
    line, _ = failed_in_one_line(
        ["reindex", "--data-dir", str(tmp_path), "--only-principal", "ana"], tmp_path, env
    )
    assert line == (
        "memoria reindex: --only-principal needs --only-tenant (a principal lives in a tenant)"
    )
    line, _ = failed_in_one_line(
        ["reindex", "--data-dir", str(tmp_path), "--only-tenant", " t1"], tmp_path, env
    )
    assert line.startswith("memoria reindex: --only-tenant ")
    assert not (tmp_path / "chunks").exists()  # refused before anything was opened
