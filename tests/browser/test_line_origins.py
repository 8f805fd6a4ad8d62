"""Every turn attributed, on the person's page (issue 25 items 4 and 7): a scripted turn made
through the Python adapter (memoria_client.MemoriaTurnAdapter) shows on the settings page where
each line came from, with its conversation and turn, and the turn's inspector shows what it
read and wrote; repeated and near-duplicate lines are pointed out as the model is told."""

from __future__ import annotations

from datetime import UTC, datetime

from playwright.sync_api import Locator, Page, ViewportSize, expect

from memoria.v1 import memory_block_pb2
from memoria.v1 import memory_block_service_pb2 as pb
from memoria_client import MemoriaTurnAdapter
from tests.browser.conftest import Person

SCREEN: ViewportSize = {"width": 1280, "height": 800}


def _line(page: Page, number: int) -> Locator:
    return page.locator(f"#lines li[data-line='{number}']")


def test_each_line_shows_its_origin_and_the_turn_it_came_from(person: Person) -> None:
    adapter = MemoriaTurnAdapter(person.api.channel, person.who)
    # Turn 1 of "trip": the model reads its section, searches and saves two lines.
    adapter.start_turn("trip", "1")
    assert "Personal memory" in adapter.prompt_section()
    searched = adapter.execute(
        "conversation_search", {"query": "window seat", "start_time": "2026-10-01"}
    )
    assert not searched.is_error
    saved = adapter.execute(
        "memory_rewrite", {"text": "Preferred name: Ana\nJira account: acct-7731"}
    )
    assert saved.text.startswith("Saved.") and not saved.is_error
    adapter.finish_turn(
        "Call me Ana; my Jira account is acct-7731.",
        "Noted.",
        datetime(2026, 11, 2, 9, 30, tzinfo=UTC),
    )
    assert adapter.flush(timeout=30) == 0

    # The person adds a line on the page.
    page = person.page
    page.set_viewport_size(SCREEN)
    person.open()
    expect(page.locator("#lines li")).to_have_count(2)
    page.fill("#block", "Preferred name: Ana\nJira account: acct-7731\nLikes window seats")
    page.click("#save")
    expect(page.locator("#block-status")).to_have_text("Saved.")
    expect(_line(page, 3)).to_contain_text("by you")

    # Turn 2: the model writes a near-duplicate; it reads it pointed out, nothing dropped.
    adapter.start_turn("trip", "2")
    assert "Likes window seats" in adapter.prompt_section()
    text = "Preferred name: Ana\nJira account: acct-7731\nLikes window seats\nPreferred name is Ana"
    second = adapter.execute("memory_rewrite", {"text": text})
    assert "* lines 1 and 4 (near-duplicates):" in second.text
    adapter.finish_turn("Actually, note my name again.", "Done.")
    assert adapter.flush(timeout=30) == 0
    stored = person.api.blocks.GetMemoryBlock(
        pb.GetMemoryBlockRequest(view=pb.MEMORY_BLOCK_VIEW_FULL), metadata=person.who
    )
    assert stored.memory_block.text == text

    page.reload()  # still signed in: the sign-in is kept for the tab
    expect(page.locator("#account")).to_be_visible()
    line1, line3, line4 = _line(page, 1), _line(page, 3), _line(page, 4)
    expect(line1.locator(".origin")).to_contain_text(
        "by the assistant in conversation trip, turn 1"
    )
    expect(line3.locator(".origin")).to_contain_text("by you")
    expect(line3.locator(".origin button")).to_have_count(0)  # the page's write named no turn
    expect(line4.locator(".origin")).to_contain_text(
        "by the assistant in conversation trip, turn 2"
    )
    # The near-duplicates are pointed out, on both lines and above the list.
    expect(line1).to_have_class("duplicate")
    expect(line1.locator(".duplicate-note")).to_have_text("Nearly the same as line 4")
    expect(line4.locator(".duplicate-note")).to_have_text("Nearly the same as line 1")
    expect(_line(page, 2)).not_to_have_class("duplicate")
    expect(page.locator("#duplicates")).to_contain_text("One group of lines repeats each other")
    page.locator("#lines-section").scroll_into_view_if_needed()
    page.screenshot(path="/tmp/memoria-line-origins.png")

    # The origin's button opens that turn's inspector: what it read, searched and wrote.
    line1.locator(".origin button.inspect").click()
    inspection = page.locator("#inspection")
    expect(inspection).to_be_visible()
    expect(page.locator("#inspection-title")).to_have_text("What turn 1 of trip used")
    expect(inspection.locator(".render")).to_contain_text("Memory loaded")
    expect(inspection.locator(".render")).to_contain_text("(your memory has changed since)")
    # The search's bounds are shown with it (where the model looked).
    expect(inspection.locator(".search")).to_contain_text("Searched for “window seat” from ")
    expect(inspection.locator(".write")).to_contain_text("The assistant changed the memory")
    expect(inspection.locator(".write .added")).to_have_text(
        ["+ Preferred name: Ana", "+ Jira account: acct-7731"]
    )
    page.screenshot(path="/tmp/memoria-turn-inspection.png")
    line4.locator(".origin button.inspect").click()
    expect(page.locator("#inspection-title")).to_have_text("What turn 2 of trip used")
    expect(inspection.locator(".write .added")).to_have_text(["+ Preferred name is Ana"])


def test_a_repeated_line_is_pointed_out_and_clear_all_leaves_no_origin(person: Person) -> None:
    request = pb.RewriteMemoryBlockRequest(
        text="Projects:\n- Memoria\nInterests:\n- memoria", writer=memory_block_pb2.WRITER_MODEL
    )
    answer = person.api.blocks.RewriteMemoryBlock(request, metadata=person.who)
    assert [list(g.line_indexes) for g in answer.duplicate_lines] == [[1, 3]]
    page = person.open()
    expect(page.locator("#lines li.duplicate")).to_have_count(2)
    expect(_line(page, 2).locator(".duplicate-note")).to_have_text("Repeats line 4")
    # Written without a turn: by the assistant, and no turn to open.
    expect(_line(page, 2).locator(".origin")).to_contain_text("by the assistant")
    expect(_line(page, 2).locator(".origin button")).to_have_count(0)

    page.click("#clear")
    page.click("#clear-yes")
    expect(page.locator("#block-status")).to_have_text("Your memory was cleared.")
    expect(page.locator("#lines-section")).to_be_hidden()
    # Nothing is left to say where a line came from: no block, no origins.
    again = person.api.blocks.GetMemoryBlock(
        pb.GetMemoryBlockRequest(view=pb.MEMORY_BLOCK_VIEW_FULL), metadata=person.who
    )
    assert list(again.line_origins) == [] and again.memory_block.text == ""
