"""A stored block over a lowered limit: its identical rewrite is a no-op, nothing else passes.

DESIGN 2 promises that a rewrite identical to the stored text changes nothing; that holds for
a block stored before the limit was lowered too (it once answered BLOCK_TOO_LONG).
"""

from __future__ import annotations

import pytest

from server.domain.errors import ErrorReason, MemoriaError
from server.domain.memory import MemoryBlocks
from server.domain.model import Identity, Writer
from tests.fakes import InMemoryMemoryStore
from tests.unit.test_memory import Clock

ANA = Identity("acme", "ana")


@pytest.fixture
def lowered() -> tuple[InMemoryMemoryStore, MemoryBlocks]:
    """Ana's block of 300 characters, served under a limit of 100."""
    store = InMemoryMemoryStore()
    MemoryBlocks(store, Clock()).rewrite(ANA, "w" * 300, Writer.USER)
    return store, MemoryBlocks(store, Clock(), char_limit=100)


@pytest.mark.parametrize("writer", [Writer.USER, Writer.MODEL])
def test_identical_rewrite_over_a_lowered_limit_is_a_no_op(
    lowered: tuple[InMemoryMemoryStore, MemoryBlocks], writer: Writer
) -> None:
    store, blocks = lowered
    before = blocks.get(ANA)
    events = len(store.audit)
    # Sanitizing makes it identical: the same text with a zero-width space and a trailing \r\n.
    for text in ("w" * 300, "w" * 150 + "\u200b" + "w" * 150 + "\r\n"):
        result = blocks.rewrite(ANA, text, writer, etag=before.etag)
        assert not result.changed
        assert (result.removed_lines, result.added_lines) == ((), ())
        assert result.block == before
    assert blocks.get(ANA) == before
    assert len(store.audit) == events


@pytest.mark.parametrize("text", ["w" * 301, "w" * 299, "v" * 300, "w" * 150 + "\n" + "w" * 150])
def test_any_other_rewrite_over_the_lowered_limit_is_too_long(
    lowered: tuple[InMemoryMemoryStore, MemoryBlocks], text: str
) -> None:
    _, blocks = lowered
    with pytest.raises(MemoriaError) as caught:
        blocks.rewrite(ANA, text, Writer.USER)
    assert caught.value.reason is ErrorReason.BLOCK_TOO_LONG
    assert caught.value.metadata["char_limit"] == "100"
    assert blocks.get(ANA).text == "w" * 300


def test_too_long_wins_over_a_stale_etag(
    lowered: tuple[InMemoryMemoryStore, MemoryBlocks],
) -> None:
    """As before: a text that can never be saved is reported before the etag race."""
    _, blocks = lowered
    with pytest.raises(MemoriaError) as caught:
        blocks.rewrite(ANA, "x" * 200, Writer.USER, etag="stale")
    assert caught.value.reason is ErrorReason.BLOCK_TOO_LONG


def test_an_over_limit_write_without_a_stored_block_is_too_long() -> None:
    blocks = MemoryBlocks(InMemoryMemoryStore(), Clock(), char_limit=10)
    with pytest.raises(MemoriaError) as caught:
        blocks.rewrite(ANA, "w" * 11, Writer.MODEL)
    assert caught.value.reason is ErrorReason.BLOCK_TOO_LONG
