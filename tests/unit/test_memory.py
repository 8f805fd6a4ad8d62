"""The rules of the memory block (DESIGN 2) on the in-memory store."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from server.domain.errors import ErrorReason, MemoriaError
from server.domain.memory import MAX_WRITE_ATTEMPTS, MemoryBlocks, render_header
from server.domain.model import AuditAction, Change, Identity, PrincipalMemory, StoredBlock, Writer
from server.domain.text import sanitize_and_count
from tests.fakes import InMemoryMemoryStore

ANA = Identity("acme", "ana")
BOB = Identity("acme", "bob")


class Clock:
    """A clock that moves one second per reading, so update times are distinct."""

    def __init__(self) -> None:
        self.now = datetime(2026, 1, 1, tzinfo=UTC)

    def __call__(self) -> datetime:
        self.now += timedelta(seconds=1)
        return self.now


@pytest.fixture
def store() -> InMemoryMemoryStore:
    return InMemoryMemoryStore()


@pytest.fixture
def blocks(store: InMemoryMemoryStore) -> MemoryBlocks:
    return MemoryBlocks(store, Clock())


def reason(excinfo: pytest.ExceptionInfo[MemoriaError]) -> ErrorReason:
    return excinfo.value.reason


def events(store: InMemoryMemoryStore, who: Identity = ANA) -> list[AuditAction]:
    return [
        e.action
        for t, e in store.audit
        if t == who.tenant_id and e.principal_id == who.principal_id
    ]


def test_no_block_reads_as_empty_not_error(blocks: MemoryBlocks) -> None:
    view = blocks.get(ANA)
    assert (view.text, view.char_count, view.etag, view.update_time) == ("", 0, "", None)
    assert view.char_limit == 4000
    rendered = blocks.render(ANA)
    assert (rendered.prompt_section, rendered.etag, rendered.char_count) == ("", "", 0)


def test_rewrite_saves_sanitized_text_and_reports_added_lines(blocks: MemoryBlocks) -> None:
    result = blocks.rewrite(ANA, "  Name: A\u200bna\r\nLikes tea\u202e \n", Writer.MODEL)
    assert result.changed
    assert result.block.text == "Name: Ana\nLikes tea"
    assert result.block.char_count == 19
    assert result.added_lines == ("Name: Ana", "Likes tea")
    assert result.removed_lines == ()
    assert blocks.get(ANA).text == "Name: Ana\nLikes tea"


def test_render_has_header_with_count_and_limit(blocks: MemoryBlocks) -> None:
    blocks.rewrite(ANA, "x" * 1234, Writer.USER)
    rendered = blocks.render(ANA)
    assert rendered.prompt_section == "Personal memory (1,234/4,000 characters)\n" + "x" * 1234
    assert rendered.char_count == 1234
    assert rendered.etag == blocks.get(ANA).etag


@pytest.mark.parametrize("text", ["", "   \n\t", "\u200b\ufeff\U000e0041"])
def test_empty_rewrite_is_refused_and_keeps_the_block(
    blocks: MemoryBlocks, store: InMemoryMemoryStore, text: str
) -> None:
    blocks.rewrite(ANA, "keep me", Writer.MODEL)
    before = blocks.get(ANA)
    with pytest.raises(MemoriaError) as excinfo:
        blocks.rewrite(ANA, text, Writer.MODEL)
    assert reason(excinfo) is ErrorReason.BLOCK_EMPTY
    assert "DeleteMemoryBlock" in excinfo.value.message
    assert blocks.get(ANA) == before
    assert events(store) == [AuditAction.BLOCK_REWRITTEN]


def test_over_limit_is_refused_never_truncated(blocks: MemoryBlocks) -> None:
    blocks.rewrite(ANA, "keep me", Writer.MODEL)
    assert blocks.rewrite(ANA, "y" * 4000, Writer.MODEL).block.char_count == 4000
    with pytest.raises(MemoriaError) as excinfo:
        blocks.rewrite(ANA, "z" * 4001, Writer.MODEL)
    assert reason(excinfo) is ErrorReason.BLOCK_TOO_LONG
    assert excinfo.value.metadata == {"char_count": "4001", "char_limit": "4000"}
    assert blocks.get(ANA).text == "y" * 4000


def test_limit_counts_sanitized_code_points(blocks: MemoryBlocks) -> None:
    padded = "\u200b" * 50 + "\U0001f600" * 4000 + "  \n"
    assert blocks.rewrite(ANA, padded, Writer.MODEL).block.char_count == 4000


def test_identical_rewrite_is_a_no_op(blocks: MemoryBlocks, store: InMemoryMemoryStore) -> None:
    first = blocks.rewrite(ANA, "a\nb", Writer.MODEL)
    again = blocks.rewrite(ANA, " a\r\nb\u200b ", Writer.MODEL)
    assert not again.changed
    assert again.block.etag == first.block.etag
    assert again.block.update_time == first.block.update_time
    assert (again.removed_lines, again.added_lines) == ((), ())
    assert events(store) == [AuditAction.BLOCK_REWRITTEN]


def test_model_writes_are_last_write_wins(blocks: MemoryBlocks) -> None:
    blocks.rewrite(ANA, "one", Writer.MODEL)
    blocks.rewrite(ANA, "two", Writer.MODEL)
    assert blocks.get(ANA).text == "two"


def test_etag_detects_a_changed_block(blocks: MemoryBlocks) -> None:
    seen = blocks.rewrite(ANA, "v1", Writer.USER).block.etag
    blocks.rewrite(ANA, "v2 by the model", Writer.MODEL)
    with pytest.raises(MemoriaError) as excinfo:
        blocks.rewrite(ANA, "v2 by the user", Writer.USER, etag=seen)
    assert reason(excinfo) is ErrorReason.ETAG_MISMATCH
    assert blocks.get(ANA).text == "v2 by the model"
    current = blocks.get(ANA).etag
    assert blocks.rewrite(ANA, "v3", Writer.USER, etag=current).block.text == "v3"


def test_empty_etag_means_no_block_yet(blocks: MemoryBlocks) -> None:
    assert blocks.rewrite(ANA, "first", Writer.USER, etag="").changed
    with pytest.raises(MemoriaError) as excinfo:
        blocks.rewrite(ANA, "second", Writer.USER, etag="")
    assert reason(excinfo) is ErrorReason.ETAG_MISMATCH


def test_etag_of_a_deleted_and_rewritten_block_does_not_match(blocks: MemoryBlocks) -> None:
    old = blocks.rewrite(ANA, "same", Writer.USER).block.etag
    blocks.delete(ANA, Writer.USER)
    blocks.rewrite(ANA, "same", Writer.MODEL)
    with pytest.raises(MemoriaError):
        blocks.rewrite(ANA, "mine", Writer.USER, etag=old)


def test_delete_removes_the_row_and_audits_only_a_count(
    blocks: MemoryBlocks, store: InMemoryMemoryStore
) -> None:
    blocks.rewrite(ANA, "secret one\nsecret two\nsecret three", Writer.USER)
    result = blocks.delete(ANA, Writer.USER)
    assert (result.deleted, result.removed_line_count) == (True, 3)
    assert ("acme", "ana") not in store.blocks
    assert blocks.get(ANA).etag == ""
    delete_event = store.audit[-1][1]
    assert delete_event.action is AuditAction.BLOCK_DELETED
    assert delete_event.removed_line_count == 3
    assert delete_event.removed_lines == () and delete_event.added_lines == ()


def test_delete_without_block_changes_nothing(
    blocks: MemoryBlocks, store: InMemoryMemoryStore
) -> None:
    assert blocks.delete(ANA, Writer.MODEL).deleted is False
    assert store.audit == []


def test_audit_of_rewrite_keeps_changed_lines_truncated(
    blocks: MemoryBlocks, store: InMemoryMemoryStore
) -> None:
    blocks.rewrite(ANA, "keep\n" + "L" * 500, Writer.MODEL)
    event = store.audit[-1][1]
    assert event.writer is Writer.MODEL
    assert event.added_lines == ("keep", "L" * 199 + "…")
    assert event.added_line_count == 2
    assert event.char_count == 505


def test_disabled_memory_renders_empty_and_refuses_model_writes(
    blocks: MemoryBlocks, store: InMemoryMemoryStore
) -> None:
    blocks.rewrite(ANA, "likes tea", Writer.MODEL)
    assert blocks.update_settings(ANA, Writer.USER, memory_enabled=False).memory_enabled is False
    assert blocks.render(ANA).prompt_section == ""
    for write in (
        lambda: blocks.rewrite(ANA, "likes coffee", Writer.MODEL),
        lambda: blocks.delete(ANA, Writer.MODEL),
    ):
        with pytest.raises(MemoriaError) as excinfo:
            write()
        assert reason(excinfo) is ErrorReason.MEMORY_DISABLED
    assert blocks.get(ANA).text == "likes tea"
    assert blocks.rewrite(ANA, "likes water", Writer.USER).changed
    blocks.update_settings(ANA, Writer.USER, memory_enabled=True)
    assert blocks.render(ANA).prompt_section.endswith("\nlikes water")
    assert events(store).count(AuditAction.SETTINGS_UPDATED) == 2


def test_settings_update_that_changes_nothing_is_not_audited(
    blocks: MemoryBlocks, store: InMemoryMemoryStore
) -> None:
    assert blocks.settings(ANA).memory_enabled is True
    blocks.update_settings(ANA, Writer.USER, memory_enabled=True)
    blocks.update_settings(ANA, Writer.USER, memory_enabled=None)
    assert store.audit == []


def test_stored_block_over_a_lowered_limit_is_shown_whole(store: InMemoryMemoryStore) -> None:
    MemoryBlocks(store, Clock()).rewrite(ANA, "w" * 300, Writer.USER)
    lowered = MemoryBlocks(store, Clock(), char_limit=100)
    view = lowered.get(ANA)
    assert (view.char_count, view.char_limit, view.over_limit) == (300, 100, True)
    rendered = lowered.render(ANA)
    assert rendered.prompt_section.startswith(
        "Personal memory (300/100 characters, over the limit)\n"
    )
    assert rendered.prompt_section.endswith("w" * 300)
    with pytest.raises(MemoriaError):
        lowered.rewrite(ANA, "w" * 150, Writer.USER)
    assert lowered.rewrite(ANA, "w" * 90, Writer.USER).changed


def test_rows_written_by_other_means_are_sanitized_on_load(store: InMemoryMemoryStore) -> None:
    store.blocks[("acme", "ana")] = StoredBlock(
        "hidden\U000e0041\u202e text\r\n", "e1", datetime(2026, 1, 1, tzinfo=UTC)
    )
    blocks = MemoryBlocks(store, Clock())
    assert blocks.get(ANA).text == "hidden text"
    assert blocks.render(ANA).prompt_section == render_header(11, 4000) + "\nhidden text"


def test_a_row_read_back_is_sanitized_once_however_often_it_is_rendered(
    store: InMemoryMemoryStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The read cache hands the same row to every render: its sanitized text is computed on
    the first, and a row that was clean already keeps its one string."""
    calls: list[str] = []

    def counting(text: str) -> tuple[str, int]:
        calls.append(text)
        return sanitize_and_count(text)

    monkeypatch.setattr("server.domain.model.sanitize_and_count", counting)
    dirty = StoredBlock("Ana\u200b likes tea\r\n", "e1", datetime(2026, 1, 1, tzinfo=UTC))
    clean = StoredBlock("Bo likes café", "e2", datetime(2026, 1, 1, tzinfo=UTC))
    store.blocks[("acme", "ana")] = dirty
    store.blocks[("acme", "bob")] = clean
    blocks = MemoryBlocks(store, Clock())
    for _ in range(3):
        assert blocks.render(ANA).prompt_section.endswith("\nAna likes tea")
        assert blocks.get(BOB).text == "Bo likes café"
    assert len(calls) == 2
    assert blocks.get(BOB).text is clean.text


def test_principals_do_not_see_each_other(blocks: MemoryBlocks) -> None:
    blocks.rewrite(ANA, "ana's", Writer.MODEL)
    assert blocks.get(BOB).text == ""
    assert blocks.get(Identity("other", "ana")).text == ""


def test_limit_must_be_positive(store: InMemoryMemoryStore) -> None:
    with pytest.raises(ValueError):
        MemoryBlocks(store, Clock(), char_limit=0)


def test_delete_blanks_the_lines_of_earlier_events_but_keeps_their_counts(
    blocks: MemoryBlocks, store: InMemoryMemoryStore
) -> None:
    blocks.rewrite(ANA, "vault code 4821\nlikes tea", Writer.MODEL)
    blocks.rewrite(ANA, "likes tea", Writer.MODEL)
    blocks.rewrite(BOB, "bob's vault code", Writer.MODEL)
    blocks.delete(ANA, Writer.USER)
    ana = [e for t, e in store.audit if e.principal_id == "ana"]
    assert [e.action for e in ana] == [
        AuditAction.BLOCK_REWRITTEN,
        AuditAction.BLOCK_REWRITTEN,
        AuditAction.BLOCK_DELETED,
    ]
    assert all(e.added_lines == () and e.removed_lines == () for e in ana)
    assert [(e.added_line_count, e.removed_line_count) for e in ana] == [(2, 0), (0, 1), (0, 1)]
    bob = [e for t, e in store.audit if e.principal_id == "bob"]
    assert bob[0].added_lines == ("bob's vault code",)


def test_the_model_may_turn_memory_off_but_never_back_on(
    blocks: MemoryBlocks, store: InMemoryMemoryStore
) -> None:
    assert not blocks.update_settings(ANA, Writer.MODEL, memory_enabled=False).memory_enabled
    with pytest.raises(MemoriaError) as excinfo:
        blocks.update_settings(ANA, Writer.MODEL, memory_enabled=True)
    assert reason(excinfo) is ErrorReason.MEMORY_DISABLED
    assert not blocks.settings(ANA).memory_enabled
    assert blocks.update_settings(ANA, Writer.USER, memory_enabled=True).memory_enabled
    assert events(store) == [AuditAction.SETTINGS_UPDATED, AuditAction.SETTINGS_UPDATED]


class StaleFirstRead(InMemoryMemoryStore):
    """Answers the next read with a snapshot taken earlier, like a stale cache copy."""

    def __init__(self) -> None:
        super().__init__()
        self.stale: PrincipalMemory | None = None

    def read(self, tenant_id: str, principal_id: str) -> PrincipalMemory:
        if self.stale is not None:
            stale, self.stale = self.stale, None
            return stale
        return super().read(tenant_id, principal_id)


def test_a_write_decided_on_stale_state_is_decided_again() -> None:
    store = StaleFirstRead()
    blocks = MemoryBlocks(store, Clock())
    blocks.rewrite(ANA, "one", Writer.MODEL)
    store.stale = store.read("acme", "ana")
    blocks.rewrite(ANA, "two", Writer.MODEL)
    result = blocks.rewrite(ANA, "three", Writer.MODEL)  # first decided on "one"
    assert result.removed_lines == ("two",)  # the diff is against what it really replaced
    assert blocks.get(ANA).text == "three"


def test_a_refusal_is_never_based_on_stale_state() -> None:
    store = StaleFirstRead()
    blocks = MemoryBlocks(store, Clock())
    blocks.rewrite(ANA, "one", Writer.USER)
    store.stale = store.read("acme", "ana")
    current = blocks.rewrite(ANA, "two", Writer.MODEL).block.etag
    # The stale snapshot's etag differs from `current`; the write must still succeed.
    assert blocks.rewrite(ANA, "three", Writer.USER, etag=current).changed


def test_a_no_op_is_never_based_on_stale_state() -> None:
    store = StaleFirstRead()
    blocks = MemoryBlocks(store, Clock())
    blocks.rewrite(ANA, "same", Writer.USER)
    store.stale = store.read("acme", "ana")
    blocks.rewrite(ANA, "changed meanwhile", Writer.MODEL)
    assert blocks.rewrite(ANA, "same", Writer.USER).changed  # stale said "no change"
    assert blocks.get(ANA).text == "same"


def test_endless_lost_races_end_in_write_conflict() -> None:
    class AlwaysRaced(InMemoryMemoryStore):
        def apply(self, tenant_id: str, change: Change) -> bool:
            self.applies += 1
            return False

    store = AlwaysRaced()
    with pytest.raises(MemoriaError) as excinfo:
        MemoryBlocks(store, Clock()).rewrite(ANA, "text", Writer.MODEL)
    assert reason(excinfo) is ErrorReason.WRITE_CONFLICT
    assert store.applies == MAX_WRITE_ATTEMPTS
    assert store.blocks == {}
