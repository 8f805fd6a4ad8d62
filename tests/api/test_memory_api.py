"""The personal memory block through the API (DESIGN 2), on SQLite and PostgreSQL.

Each test calls a real server through the generated stubs as one principal of a fresh tenant
and checks what a client can observe: the block, the rendered prompt section, the line diff,
the status code, ErrorInfo reason and domain, BadRequest field violations, and (through
ListAuditEvents) whether a call left an audit event behind.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import grpc
import pytest

from memoria.v1 import audit_service_pb2 as audit_pb
from memoria.v1 import memory_block_pb2 as block_pb
from memoria.v1 import memory_block_service_pb2 as pb
from memoria.v1 import memory_block_service_pb2_grpc as pb_grpc
from tests.api.conftest import (
    ON_POOLER_AND_CITUS,
    Api,
    Metadata,
    error_info,
    expect_error,
    field_violations,
    server_settings,
    start_server,
)

USER = block_pb.WRITER_USER
MODEL = block_pb.WRITER_MODEL
LIMIT = 4000


@dataclass
class Caller:
    """One principal calling the block service (and reading its own audit log)."""

    blocks: pb_grpc.MemoryBlockServiceStub
    api: Api
    md: Metadata

    def get(self) -> block_pb.MemoryBlock:
        return self.blocks.GetMemoryBlock(pb.GetMemoryBlockRequest(), metadata=self.md).memory_block

    def render(self) -> pb.RenderMemoryBlockResponse:
        return self.blocks.RenderMemoryBlock(pb.RenderMemoryBlockRequest(), metadata=self.md)

    def rewrite(
        self, text: str, writer: block_pb.Writer.ValueType = USER, etag: str | None = None
    ) -> pb.RewriteMemoryBlockResponse:
        request = pb.RewriteMemoryBlockRequest(text=text, writer=writer, etag=etag)
        return self.blocks.RewriteMemoryBlock(request, metadata=self.md)

    def delete(
        self, writer: block_pb.Writer.ValueType = USER, etag: str | None = None
    ) -> pb.DeleteMemoryBlockResponse:
        request = pb.DeleteMemoryBlockRequest(writer=writer, etag=etag)
        return self.blocks.DeleteMemoryBlock(request, metadata=self.md)

    def settings(self) -> block_pb.MemorySettings:
        request = pb.GetMemorySettingsRequest()
        return self.blocks.GetMemorySettings(request, metadata=self.md).settings

    def update_settings(
        self, enabled: bool | None, writer: block_pb.Writer.ValueType = USER
    ) -> block_pb.MemorySettings:
        request = pb.UpdateMemorySettingsRequest(memory_enabled=enabled, writer=writer)
        return self.blocks.UpdateMemorySettings(request, metadata=self.md).settings

    def event_count(self) -> int:
        request = audit_pb.ListAuditEventsRequest(page_size=500)
        response = self.api.audit.ListAuditEvents(request, metadata=self.md)
        assert not response.next_page_token
        return len(response.events)


@pytest.fixture
def me(api: Api) -> Caller:
    """A principal of the test's fresh tenant, with nothing stored yet."""
    return Caller(api.blocks, api, api.who("p-1"))


def header(count: str, limit: str = "4,000") -> str:
    return f"Personal memory ({count}/{limit} characters)"


# --- reading with no block ---------------------------------------------------------------


def test_get_without_a_block_returns_an_empty_block(me: Caller) -> None:
    block = me.get()
    assert block.text == ""
    assert block.etag == ""
    assert block.char_count == 0
    assert block.char_limit == LIMIT
    assert not block.HasField("update_time")


def test_render_without_a_block_returns_an_empty_section(me: Caller) -> None:
    rendered = me.render()
    assert rendered.prompt_section == ""
    assert rendered.etag == ""
    assert rendered.char_count == 0
    assert rendered.char_limit == LIMIT


# --- rewrite, diff and render ------------------------------------------------------------


def test_first_rewrite_returns_the_saved_block_and_its_lines_as_added(me: Caller) -> None:
    result = me.rewrite("Name: Ada\nPrefers: short answers\nTracker: acct-4821")

    assert result.changed
    block = result.memory_block
    assert block.text == "Name: Ada\nPrefers: short answers\nTracker: acct-4821"
    assert block.char_count == len(block.text)
    assert block.char_limit == LIMIT
    assert block.etag
    assert block.HasField("update_time")
    assert list(result.removed_lines) == []
    assert list(result.added_lines) == ["Name: Ada", "Prefers: short answers", "Tracker: acct-4821"]
    stored = me.get()
    assert (stored.text, stored.etag, stored.update_time) == (
        block.text,
        block.etag,
        block.update_time,
    )


@ON_POOLER_AND_CITUS
def test_second_rewrite_returns_the_line_diff_in_order(me: Caller) -> None:
    first = me.rewrite("keep 1\nold a\nkeep 2\nold b\nkeep 3")
    second = me.rewrite("keep 1\nnew a\nkeep 2\nkeep 3\nnew b")

    assert second.changed
    assert list(second.removed_lines) == ["old a", "old b"]
    assert list(second.added_lines) == ["new a", "new b"]
    assert second.memory_block.text == "keep 1\nnew a\nkeep 2\nkeep 3\nnew b"
    assert second.memory_block.etag != first.memory_block.etag
    assert me.get().etag == second.memory_block.etag


@ON_POOLER_AND_CITUS
def test_render_is_the_header_a_newline_and_the_text(me: Caller) -> None:
    saved = me.rewrite("Name: Ada\nLikes tea").memory_block

    rendered = me.render()
    assert rendered.prompt_section == header("19") + "\nName: Ada\nLikes tea"
    assert rendered.etag == saved.etag
    assert rendered.char_count == 19
    assert rendered.char_limit == LIMIT


def test_render_header_uses_thousands_separators(me: Caller) -> None:
    text = "\n".join(["x" * 99] * 12) + "\n" + "y" * 34  # 12*99 + 12 newlines + 34 = 1,234
    assert len(text) == 1234
    me.rewrite(text)

    rendered = me.render()
    assert rendered.prompt_section == "Personal memory (1,234/4,000 characters)\n" + text
    assert rendered.char_count == 1234


# --- sanitizing and counting -------------------------------------------------------------

INVISIBLE = {
    "zero_width_space": "\u200b",
    "right_to_left_override": "\u202e",
    "tag_latin_capital_a": "\U000e0041",
    "byte_order_mark": "\ufeff",
    "soft_hyphen": "\u00ad",
    "nul": "\x00",
    # Default-ignorable, not Cf (issue 16.6), and the braille blank outside braille.
    "combining_grapheme_joiner": "\u034f",
    "hangul_filler": "\u3164",
    "hangul_choseong_filler": "\u115f",
    "halfwidth_hangul_filler": "\uffa0",
    "khmer_vowel_inherent_aq": "\u17b4",
    "unassigned_default_ignorable": "\u2065",
    "unassigned_specials": "\ufff0",
    "unassigned_plane_14": "\U000e0080",
    "braille_pattern_blank": "\u2800",
    "zero_width_joiner_between_latin_letters": "\u200d",
}


@pytest.mark.parametrize("char", INVISIBLE.values(), ids=INVISIBLE.keys())
def test_invisible_characters_never_reach_get_or_render(me: Caller, char: str) -> None:
    result = me.rewrite(f"{char}ab{char}c\nd{char}e{char}")

    assert result.memory_block.text == "abc\nde"
    assert result.memory_block.char_count == 6
    assert list(result.added_lines) == ["abc", "de"]
    block = me.get()
    assert block.text == "abc\nde"
    assert block.char_count == 6
    rendered = me.render()
    assert rendered.prompt_section == header("6") + "\nabc\nde"
    assert char not in block.text
    assert char not in rendered.prompt_section


def test_all_invisible_characters_together_are_removed_and_not_counted(me: Caller) -> None:
    text = "x" + "x".join(INVISIBLE.values()) + "x"  # an x between any two of them

    block = me.rewrite(text).memory_block
    assert block.text == "x" * (len(INVISIBLE) + 1)
    assert block.char_count == len(INVISIBLE) + 1
    assert me.render().char_count == len(INVISIBLE) + 1


def test_crlf_and_lone_cr_become_newlines(me: Caller) -> None:
    result = me.rewrite("one\r\ntwo\rthree\r\n")

    assert result.memory_block.text == "one\ntwo\nthree"
    assert list(result.added_lines) == ["one", "two", "three"]
    assert "\r" not in me.render().prompt_section


def test_line_and_paragraph_separators_become_newlines(me: Caller) -> None:
    result = me.rewrite("one\u2028two\u2029three\u2028")

    assert result.memory_block.text == "one\ntwo\nthree"
    assert list(result.added_lines) == ["one", "two", "three"]


def test_unassigned_tag_block_code_points_are_removed(me: Caller) -> None:
    text = "a\U000e0000b\U000e0002c\U000e001fd"
    assert me.rewrite(text).memory_block.text == "abcd"


# --- empty and over-limit rewrites -------------------------------------------------------

EMPTY_TEXTS = {
    "empty": "",
    "whitespace_only": "  \n\t \r\n \u3000 ",
    "invisible_only": "\u200b\ufeff\u00ad\u202e\U000e0041\x00",
    "invisible_and_whitespace": " \u200b \n\ufeff\t",
}


@pytest.mark.parametrize("text", EMPTY_TEXTS.values(), ids=EMPTY_TEXTS.keys())
def test_an_empty_rewrite_is_refused_and_the_block_stays(me: Caller, text: str) -> None:
    before = me.rewrite("keep me").memory_block
    events = me.event_count()

    error = expect_error(
        lambda: me.rewrite(text),
        grpc.StatusCode.INVALID_ARGUMENT,
        "ERROR_REASON_BLOCK_EMPTY",
    )

    assert "text" in field_violations(error)
    after = me.get()
    assert (after.text, after.etag) == (before.text, before.etag)
    assert me.event_count() == events


def test_an_empty_rewrite_without_a_block_creates_nothing(me: Caller) -> None:
    expect_error(
        lambda: me.rewrite("\u200b", writer=MODEL),
        grpc.StatusCode.INVALID_ARGUMENT,
        "ERROR_REASON_BLOCK_EMPTY",
    )
    assert me.get().etag == ""
    assert me.event_count() == 0


def test_a_rewrite_over_the_limit_is_refused_with_count_and_limit(me: Caller) -> None:
    before = me.rewrite("keep me").memory_block
    events = me.event_count()

    error = expect_error(
        lambda: me.rewrite("x" * 4001),
        grpc.StatusCode.INVALID_ARGUMENT,
        "ERROR_REASON_BLOCK_TOO_LONG",
    )

    info = error_info(error)
    assert info.metadata["char_count"] == "4001"
    assert info.metadata["char_limit"] == "4000"
    after = me.get()
    assert (after.text, after.etag) == (before.text, before.etag)
    assert me.event_count() == events


def test_exactly_the_limit_is_accepted_whole(me: Caller) -> None:
    text = "x" * LIMIT
    block = me.rewrite(text).memory_block
    assert block.text == text
    assert block.char_count == LIMIT
    assert me.get().text == text


def test_the_limit_counts_the_sanitized_stripped_text(me: Caller) -> None:
    # 4,000 visible characters plus invisible ones and outer whitespace: still 4,000.
    text = "  \n" + "\u200b".join(["x" * 1000] * 4) + "\ufeff\u00ad \n"
    block = me.rewrite(text).memory_block
    assert block.char_count == LIMIT
    assert block.text == "x" * LIMIT


def test_the_limit_counts_code_points_not_utf16_units(me: Caller) -> None:
    emoji = "\U0001f600"  # one code point, two UTF-16 units
    block = me.rewrite(emoji * LIMIT).memory_block
    assert block.char_count == LIMIT
    assert me.get().text == emoji * LIMIT
    assert me.render().prompt_section.startswith(header("4,000") + "\n")

    error = expect_error(
        lambda: me.rewrite(emoji * (LIMIT + 1)),
        grpc.StatusCode.INVALID_ARGUMENT,
        "ERROR_REASON_BLOCK_TOO_LONG",
    )
    assert error_info(error).metadata["char_count"] == "4001"


# --- identical rewrite -------------------------------------------------------------------


def test_an_identical_rewrite_changes_nothing(me: Caller) -> None:
    saved = me.rewrite("Name: Ada\nLikes tea").memory_block
    events = me.event_count()
    assert events == 1

    # The same text once sanitized: outer whitespace, CRLF and a zero-width space.
    again = me.rewrite("  Name: Ada\r\nLikes\u200b tea \n", writer=MODEL)

    assert not again.changed
    assert again.memory_block.etag == saved.etag
    assert again.memory_block.text == saved.text
    assert again.memory_block.update_time == saved.update_time
    assert list(again.removed_lines) == []
    assert list(again.added_lines) == []
    assert me.get().etag == saved.etag
    assert me.event_count() == events


# --- writer is required ------------------------------------------------------------------


def test_rewrite_without_a_writer_is_invalid(me: Caller) -> None:
    error = expect_error(
        lambda: me.rewrite("hello", writer=block_pb.WRITER_UNSPECIFIED),
        grpc.StatusCode.INVALID_ARGUMENT,
        "ERROR_REASON_INVALID_ARGUMENT",
    )
    assert "writer" in field_violations(error)
    assert me.get().etag == ""
    assert me.event_count() == 0


def test_delete_without_a_writer_is_invalid(me: Caller) -> None:
    saved = me.rewrite("hello").memory_block
    error = expect_error(
        lambda: me.delete(writer=block_pb.WRITER_UNSPECIFIED),
        grpc.StatusCode.INVALID_ARGUMENT,
        "ERROR_REASON_INVALID_ARGUMENT",
    )
    assert "writer" in field_violations(error)
    assert me.get().etag == saved.etag


def test_update_settings_without_a_writer_is_invalid(me: Caller) -> None:
    error = expect_error(
        lambda: me.update_settings(False, writer=block_pb.WRITER_UNSPECIFIED),
        grpc.StatusCode.INVALID_ARGUMENT,
        "ERROR_REASON_INVALID_ARGUMENT",
    )
    assert "writer" in field_violations(error)
    assert me.settings().memory_enabled
    assert me.event_count() == 0


def test_an_unknown_writer_number_is_invalid(me: Caller) -> None:
    error = expect_error(
        lambda: me.rewrite("hello", writer=block_pb.Writer.ValueType(99)),
        grpc.StatusCode.INVALID_ARGUMENT,
        "ERROR_REASON_INVALID_ARGUMENT",
    )
    assert "writer" in field_violations(error)


# --- etags -------------------------------------------------------------------------------


def test_rewrite_with_the_current_etag_succeeds(me: Caller) -> None:
    first = me.rewrite("v1").memory_block
    second = me.rewrite("v2", etag=first.etag)
    assert second.changed
    assert me.get().text == "v2"
    assert me.get().etag == second.memory_block.etag != first.etag


@ON_POOLER_AND_CITUS
def test_rewrite_with_a_stale_etag_is_aborted_and_saves_nothing(me: Caller) -> None:
    stale = me.rewrite("v1").memory_block.etag
    current = me.rewrite("v2").memory_block
    events = me.event_count()

    expect_error(
        lambda: me.rewrite("v3 from an old screen", etag=stale),
        grpc.StatusCode.ABORTED,
        "ERROR_REASON_ETAG_MISMATCH",
    )

    after = me.get()
    assert (after.text, after.etag) == ("v2", current.etag)
    assert me.event_count() == events


def test_rewrite_with_a_made_up_etag_is_aborted(me: Caller) -> None:
    me.rewrite("v1")
    expect_error(
        lambda: me.rewrite("v2", etag="not-an-etag"),
        grpc.StatusCode.ABORTED,
        "ERROR_REASON_ETAG_MISMATCH",
    )
    assert me.get().text == "v1"


def test_empty_etag_creates_only_when_there_is_no_block(me: Caller) -> None:
    created = me.rewrite("first", etag="")
    assert created.changed
    assert me.get().text == "first"

    expect_error(
        lambda: me.rewrite("second", etag=""),
        grpc.StatusCode.ABORTED,
        "ERROR_REASON_ETAG_MISMATCH",
    )
    assert me.get().etag == created.memory_block.etag


def test_rewrite_with_an_etag_when_there_is_no_block_is_aborted(me: Caller) -> None:
    me.rewrite("gone soon")
    old = me.get().etag
    me.delete()
    expect_error(
        lambda: me.rewrite("again", etag=old),
        grpc.StatusCode.ABORTED,
        "ERROR_REASON_ETAG_MISMATCH",
    )
    assert me.get().etag == ""


def test_rewrite_without_an_etag_always_wins(me: Caller) -> None:
    me.rewrite("from the settings screen", etag="")
    me.rewrite("from the model", writer=MODEL)
    last = me.rewrite("from the model again", writer=MODEL)
    assert last.changed
    assert list(last.removed_lines) == ["from the model"]
    assert me.get().text == "from the model again"


# --- delete ------------------------------------------------------------------------------


@ON_POOLER_AND_CITUS
def test_delete_removes_the_block(me: Caller) -> None:
    me.rewrite("line 1\nline 2\nline 3")

    result = me.delete()

    assert result.deleted
    assert result.removed_line_count == 3
    block = me.get()
    assert (block.text, block.etag, block.char_count) == ("", "", 0)
    assert not block.HasField("update_time")
    assert me.render().prompt_section == ""


def test_delete_without_a_block_changes_nothing(me: Caller) -> None:
    result = me.delete()
    assert not result.deleted
    assert result.removed_line_count == 0
    assert me.event_count() == 0


def test_delete_twice_records_one_event(me: Caller) -> None:
    me.rewrite("hello")
    assert me.delete().deleted
    assert not me.delete().deleted
    assert me.event_count() == 2  # the rewrite and the first delete


def test_delete_with_the_current_etag_succeeds(me: Caller) -> None:
    etag = me.rewrite("hello").memory_block.etag
    assert me.delete(etag=etag).deleted
    assert me.get().etag == ""


def test_delete_with_a_stale_etag_is_aborted(me: Caller) -> None:
    stale = me.rewrite("v1").memory_block.etag
    current = me.rewrite("v2").memory_block.etag

    expect_error(
        lambda: me.delete(etag=stale),
        grpc.StatusCode.ABORTED,
        "ERROR_REASON_ETAG_MISMATCH",
    )
    expect_error(
        lambda: me.delete(etag=""),
        grpc.StatusCode.ABORTED,
        "ERROR_REASON_ETAG_MISMATCH",
    )
    assert me.get().etag == current
    assert me.get().text == "v2"


def test_a_block_written_after_a_delete_gets_a_new_etag(me: Caller) -> None:
    old = me.rewrite("same text").memory_block.etag
    me.delete()
    again = me.rewrite("same text")
    assert again.changed
    assert again.memory_block.etag not in ("", old)


# --- settings and disable ----------------------------------------------------------------


def test_memory_is_enabled_by_default(me: Caller) -> None:
    settings = me.settings()
    assert settings.memory_enabled
    assert not settings.HasField("update_time")


@ON_POOLER_AND_CITUS
def test_disabled_memory_renders_empty_and_refuses_the_model(me: Caller) -> None:
    saved = me.rewrite("Name: Ada").memory_block
    settings = me.update_settings(False)
    assert not settings.memory_enabled
    assert settings.HasField("update_time")
    assert not me.settings().memory_enabled
    events = me.event_count()

    rendered = me.render()
    assert (rendered.prompt_section, rendered.etag, rendered.char_count) == ("", "", 0)

    expect_error(
        lambda: me.rewrite("Name: Bob", writer=MODEL),
        grpc.StatusCode.FAILED_PRECONDITION,
        "ERROR_REASON_MEMORY_DISABLED",
    )
    expect_error(
        lambda: me.delete(writer=MODEL),
        grpc.StatusCode.FAILED_PRECONDITION,
        "ERROR_REASON_MEMORY_DISABLED",
    )
    block = me.get()
    assert (block.text, block.etag) == ("Name: Ada", saved.etag)
    assert me.event_count() == events


def test_disabled_memory_still_lets_the_user_read_edit_and_delete(me: Caller) -> None:
    me.rewrite("Name: Ada")
    me.update_settings(False)

    edited = me.rewrite("Name: Ada Lovelace", writer=USER)
    assert edited.changed
    assert me.get().text == "Name: Ada Lovelace"
    assert me.render().prompt_section == ""

    deleted = me.delete(writer=USER)
    assert deleted.deleted
    assert me.get().etag == ""


def test_enabling_memory_again_renders_the_block(me: Caller) -> None:
    saved = me.rewrite("Name: Ada").memory_block
    me.update_settings(False)
    assert me.render().prompt_section == ""

    assert me.update_settings(True).memory_enabled

    rendered = me.render()
    assert rendered.prompt_section == header("9") + "\nName: Ada"
    assert rendered.etag == saved.etag
    assert me.rewrite("Name: Bob", writer=MODEL).changed


def test_update_with_memory_enabled_unset_changes_nothing(me: Caller) -> None:
    disabled = me.update_settings(False)
    events = me.event_count()

    unchanged = me.update_settings(None)

    assert not unchanged.memory_enabled
    assert unchanged.update_time == disabled.update_time
    assert not me.settings().memory_enabled
    assert me.event_count() == events


def test_update_to_the_current_value_is_not_audited(me: Caller) -> None:
    same = me.update_settings(True)
    assert same.memory_enabled
    assert me.event_count() == 0


# --- a lowered limit ---------------------------------------------------------------------


def test_a_block_over_a_lowered_limit_is_shown_whole_and_the_next_write_must_fit(
    api: Api, me: Caller, request: pytest.FixtureRequest, tmp_path: Path
) -> None:
    text = "a" * 100 + "\n" + "b" * 99 + "\n" + "c" * 99
    assert len(text) == 300
    saved = me.rewrite(text).memory_block

    # The server restarts with a lower limit on the same data (same SQLite data dir, or same
    # PostgreSQL db). The first one stops first: one process owns an embedded data dir.
    kind = "postgres" if api.running.store.db.engine.dialect.name == "postgresql" else "sqlite"
    api.running.stop(0)
    running, channel = start_server(server_settings(kind, request, tmp_path, char_limit=100))
    try:
        lowered = Caller(pb_grpc.MemoryBlockServiceStub(channel), api, me.md)

        block = lowered.get()
        assert block.text == text
        assert block.char_count == 300
        assert block.char_limit == 100

        rendered = lowered.render()
        head, _, body = rendered.prompt_section.partition("\n")
        assert "300/100" in head
        assert head.startswith("Personal memory (")
        assert body == text
        assert (rendered.char_count, rendered.char_limit) == (300, 100)
        assert rendered.etag == saved.etag

        error = expect_error(
            lambda: lowered.rewrite("x" * 150),
            grpc.StatusCode.INVALID_ARGUMENT,
            "ERROR_REASON_BLOCK_TOO_LONG",
        )
        assert dict(error_info(error).metadata) == {"char_count": "150", "char_limit": "100"}
        assert lowered.get().text == text

        fitted = lowered.rewrite("y" * 90)
        assert fitted.changed
        assert (fitted.memory_block.char_count, fitted.memory_block.char_limit) == (90, 100)
        assert lowered.render().prompt_section == header("90", "100") + "\n" + "y" * 90
    finally:
        channel.close()
        running.stop(0)
