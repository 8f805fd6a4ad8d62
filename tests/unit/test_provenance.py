"""Where each line of the block came from (server/domain/provenance.py): derived from the audit
log's rewrites since the last deletion, so an origin never outlives its content."""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime, timedelta

from server.domain.memory import AUDIT_LINE_CHARS, MemoryBlocks
from server.domain.model import AuditAction, AuditEvent, AuditQuery, Identity, TurnRef, Writer
from server.domain.provenance import LineOrigin, line_origins
from tests.fakes import InMemoryMemoryStore

ANA = Identity("acme", "ana")
T0 = datetime(2026, 1, 1, tzinfo=UTC)


class Clock:
    """One second per reading, so each write has its own time."""

    def __init__(self) -> None:
        self.now = T0

    def __call__(self) -> datetime:
        self.now += timedelta(seconds=1)
        return self.now


def _blocks() -> tuple[MemoryBlocks, InMemoryMemoryStore]:
    store = InMemoryMemoryStore()
    return MemoryBlocks(store, Clock()), store


def test_each_line_names_the_write_that_added_it() -> None:
    blocks, _ = _blocks()
    first = blocks.rewrite(
        ANA, "Preferred name: Ana\nJira: acct-1", Writer.MODEL, turn=TurnRef("c1", "1")
    )
    second = blocks.rewrite(ANA, "Preferred name: Ana\nLikes tea\nJira: acct-1", Writer.USER)
    third = blocks.rewrite(
        ANA, "Preferred name: Ana\nLikes tea\nJira: acct-2", Writer.MODEL, turn=TurnRef("c2", "7")
    )
    annotated = blocks.get_annotated(ANA)
    assert annotated.block.text == third.block.text
    assert annotated.origins == (
        LineOrigin(0, Writer.MODEL, first.block.update_time or T0, TurnRef("c1", "1")),
        LineOrigin(1, Writer.USER, second.block.update_time or T0, None),
        LineOrigin(2, Writer.MODEL, third.block.update_time or T0, TurnRef("c2", "7")),
    )


def test_a_line_added_again_takes_its_newest_addition() -> None:
    blocks, _ = _blocks()
    blocks.rewrite(ANA, "Likes tea", Writer.MODEL, turn=TurnRef("c1", "1"))
    blocks.rewrite(ANA, "Likes coffee", Writer.MODEL, turn=TurnRef("c1", "2"))
    again = blocks.rewrite(ANA, "Likes tea", Writer.USER)
    assert blocks.get_annotated(ANA).origins == (
        LineOrigin(0, Writer.USER, again.block.update_time or T0, None),
    )


def test_after_clear_all_nothing_before_it_is_an_origin() -> None:
    blocks, store = _blocks()
    blocks.rewrite(ANA, "Likes tea\nSecret project: Falcon", Writer.MODEL, turn=TurnRef("c1", "1"))
    blocks.delete(ANA, Writer.USER)
    # The block comes back with a line it had before, written by other means (no event of its
    # own): the deleted block's write is not its origin, and its lines are blanked anyway.
    assert [e.action for _, e in store.audit][-1] is AuditAction.BLOCK_DELETED
    events = [e for _, e in reversed(store.audit)]
    assert line_origins("Likes tea", events, line_chars=AUDIT_LINE_CHARS) == ()
    assert all(e.added_lines == () for e in events)
    assert blocks.get_annotated(ANA).origins == ()


def test_a_long_line_is_matched_by_the_start_the_audit_keeps() -> None:
    blocks, _ = _blocks()
    long = "Notes: " + "x" * 400
    saved = blocks.rewrite(ANA, f"Likes tea\n{long}", Writer.MODEL, turn=TurnRef("c1", "1"))
    origins = blocks.get_annotated(ANA).origins
    assert [o.line_index for o in origins] == [0, 1]
    assert origins[1] == LineOrigin(
        1, Writer.MODEL, saved.block.update_time or T0, TurnRef("c1", "1")
    )


def test_copies_of_a_repeated_line_take_the_newest_additions_later_copies_first() -> None:
    blocks, _ = _blocks()
    one = blocks.rewrite(ANA, "Likes tea\nA", Writer.MODEL, turn=TurnRef("c1", "1"))
    two = blocks.rewrite(ANA, "Likes tea\nA\nLikes tea", Writer.USER)
    origins = blocks.get_annotated(ANA).origins
    assert [(o.line_index, o.add_time) for o in origins] == [
        (0, one.block.update_time),
        (1, one.block.update_time),
        (2, two.block.update_time),
    ]


def test_events_after_the_version_shown_and_blank_lines_are_passed_over() -> None:
    def event(event_id: int, seconds: int, added: tuple[str, ...]) -> AuditEvent:
        return AuditEvent(
            principal_id="ana",
            action=AuditAction.BLOCK_REWRITTEN,
            writer=Writer.MODEL,
            create_time=T0 + timedelta(seconds=seconds),
            added_lines=added,
            event_id=event_id,
        )

    newer, shown = event(2, 20, ("Likes tea",)), event(1, 10, ("Likes tea", ""))
    origins = line_origins(
        "Likes tea\n", [newer, shown], line_chars=AUDIT_LINE_CHARS, as_of=T0 + timedelta(seconds=10)
    )
    assert origins == (LineOrigin(0, Writer.MODEL, T0 + timedelta(seconds=10), None),)


class CountingStore(InMemoryMemoryStore):
    """Records where each read of the audit log started."""

    def __init__(self) -> None:
        super().__init__()
        self.audit_reads: list[int | None] = []

    def list_audit(self, tenant_id: str, query: AuditQuery) -> list[AuditEvent]:
        self.audit_reads.append(query.before_event_id)
        return super().list_audit(tenant_id, query)


def test_reading_stops_once_every_line_has_its_origin() -> None:
    store = CountingStore()
    blocks = MemoryBlocks(store, Clock())
    for n in range(250):  # more than two pages of events
        blocks.rewrite(ANA, f"Line {n}", Writer.MODEL)
    blocks.rewrite(ANA, "Line 249\nLikes tea", Writer.USER)
    origins = blocks.get_annotated(ANA).origins
    assert [o.writer for o in origins] == [Writer.MODEL, Writer.USER]
    assert store.audit_reads == [None]  # both found on the first page
    # A line no event added (written by other means) reads every page, up to the bound.
    blocks.rewrite(ANA, "Line 249\nLikes tea\nNever added", Writer.USER)
    store.audit_reads.clear()
    origins = blocks.get_annotated(ANA).origins
    assert [o.line_index for o in origins] == [0, 1, 2]
    store.blocks[(ANA.tenant_id, ANA.principal_id)] = replace(
        store.blocks[(ANA.tenant_id, ANA.principal_id)], text="Line 249\nNot in the audit"
    )
    store.audit_reads.clear()
    assert [o.line_index for o in blocks.get_annotated(ANA).origins] == [0]
    assert len(store.audit_reads) == 3  # 252 events, 100 a page
