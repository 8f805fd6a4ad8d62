"""The settings page (web/) in headless Chromium against a real server: each flow of DESIGN 2's
settings rules (issue 12 item 2), with the model writing through gRPC in between."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from google.protobuf.timestamp_pb2 import Timestamp
from playwright.sync_api import expect

from memoria.v1 import audit_service_pb2 as audit_pb
from memoria.v1 import conversation_search_service_pb2 as search_pb
from memoria.v1 import memory_block_pb2
from memoria.v1 import memory_block_service_pb2 as pb
from tests.browser.conftest import Person

VECTORS = Path(__file__).parents[1] / "vectors" / "char_count.json"


def _expand(text: str | list[str | dict[str, object]]) -> str:
    """A vector's text: a string, or parts (strings and {"repeat", "times"}) joined."""
    if isinstance(text, str):
        return text
    return "".join(
        part if isinstance(part, str) else str(part["repeat"]) * int(str(part["times"]))
        for part in text
    )


def _model_writes(person: Person, text: str) -> pb.RewriteMemoryBlockResponse:
    request = pb.RewriteMemoryBlockRequest(text=text, writer=memory_block_pb2.WRITER_MODEL)
    return person.api.blocks.RewriteMemoryBlock(request, metadata=person.who)


def _stored(person: Person) -> memory_block_pb2.MemoryBlock:
    answer = person.api.blocks.GetMemoryBlock(pb.GetMemoryBlockRequest(), metadata=person.who)
    return answer.memory_block


def test_edit_counts_live_like_the_server_and_saves(
    person: Person, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    _model_writes(person, "Preferred name: Ana")
    page = person.open()
    expect(page.locator("#block")).to_have_value("Preferred name: Ana")
    # Combining marks, an emoji ZWJ sequence, a flag, a variation selector and invisible
    # characters: the page's live count must be the server's char_count for the same text.
    family = "\U0001f469\u200d\U0001f469\u200d\U0001f467"
    text = (
        f"Cafe\u0301 {family} \U0001f1eb\U0001f1f7 \u2764\ufe0f\u200b ok\u00ad \u0928\u094d\u200d"
    )
    page.fill("#block", text)
    live = int(page.locator("#count").get_attribute("data-count") or "-1")
    page.click("#save")
    expect(page.locator("#block-status")).to_have_text("Saved.")
    stored = _stored(person)
    assert live == stored.char_count
    expect(page.locator("#count")).to_contain_text(f"/ {stored.char_limit:,} characters")
    # Every shared vector counts the same in the page, typed into the box, as in the file.
    cases = json.loads(VECTORS.read_text())["cases"]
    counted = page.evaluate(
        """inputs => inputs.map(text => {
            const box = document.getElementById("block");
            box.value = text;
            box.dispatchEvent(new Event("input"));
            return Number(document.getElementById("count").dataset.count);
        })""",
        [_expand(case["input"]) for case in cases],
    )
    assert {c["name"]: n for c, n in zip(cases, counted, strict=True)} == {
        c["name"]: c["char_count"] for c in cases
    }
    # Over the limit is said clearly, and the server refuses it in words.
    page.fill("#block", "x" * (stored.char_limit + 5))
    expect(page.locator("#count")).to_have_class("over")
    expect(page.locator("#count")).to_contain_text("5 over the limit")
    page.click("#save")
    expect(page.locator("#block-status")).to_contain_text("the limit is 4,000")
    assert _stored(person).etag == stored.etag
    shot = tmp_path / "settings-page.png"
    page.screenshot(path=str(shot), full_page=True)
    with capsys.disabled():
        print(f"\nsettings page screenshot: {shot}")


def test_conflict_keeps_the_edit_and_offers_both_ways_out(person: Person) -> None:
    _model_writes(person, "Preferred name: Ana")
    page = person.open()
    page.fill("#block", "Preferred name: Ana B.")
    _model_writes(person, "Preferred name: Ana\nUses Jira account ana-42")  # meanwhile
    page.click("#save")
    expect(page.locator("#conflict")).to_be_visible()
    expect(page.locator("#conflict")).to_contain_text("Memory was changed elsewhere.")
    expect(page.locator("#block")).to_have_value("Preferred name: Ana B.")
    assert _stored(person).text == "Preferred name: Ana\nUses Jira account ana-42"
    # Load server copy: the edit is discarded, the latest is shown.
    page.click("#load-server")
    expect(page.locator("#block")).to_have_value("Preferred name: Ana\nUses Jira account ana-42")
    expect(page.locator("#conflict")).to_be_hidden()
    # Another conflict, this time overwritten with Save again.
    page.fill("#block", "Mine")
    _model_writes(person, "The model's")
    page.click("#save")
    expect(page.locator("#conflict")).to_be_visible()
    page.click("#overwrite")
    expect(page.locator("#block-status")).to_have_text("Saved.")
    assert _stored(person).text == "Mine"


def test_empty_box_is_not_saved_and_clear_all_confirms(person: Person) -> None:
    _model_writes(person, "Line one\nLine two")
    page = person.open()
    page.fill("#block", " \n\u200b ")
    page.click("#save")
    expect(page.locator("#block-status")).to_contain_text("use Clear all")
    assert _stored(person).text == "Line one\nLine two"
    page.click("#clear")
    expect(page.locator("#clear-confirm")).to_be_visible()
    assert _stored(person).text == "Line one\nLine two"  # nothing until confirmed
    page.click("#clear-yes")
    expect(page.locator("#block-status")).to_have_text("Your memory was cleared.")
    assert _stored(person).etag == ""
    expect(page.locator("#block")).to_have_value("")
    person.open_history()
    expect(page.locator("#audit li").first).to_contain_text("You cleared the memory")
    expect(page.locator("#audit li").first).to_contain_text("2 lines removed")
    # The model's earlier write lost its lines with the block, and says why.
    expect(page.locator("#audit li").nth(1)).to_contain_text(
        "0 lines removed, 2 added. Their text was deleted when your memory was cleared or "
        "erased: deleted content is not kept."
    )


def test_markup_in_the_block_is_shown_as_text(person: Person) -> None:
    hostile = '<img src=x onerror="window.__pwned=1"><script>window.__pwned=2</script><b>bold</b>'
    _model_writes(person, hostile)
    page = person.open()
    expect(page.locator("#block")).to_have_value(hostile)
    person.open_history()
    audit = page.locator("#audit li").first
    expect(audit).to_contain_text("The assistant changed the memory")
    expect(audit).to_contain_text(hostile)
    assert page.locator("#audit img, #audit script, #audit b").count() == 0
    assert page.evaluate("window.__pwned") is None


def test_memory_off_and_history(person: Person) -> None:
    _model_writes(person, "Likes short answers")
    page = person.open()
    expect(page.locator("#memory-enabled")).to_be_checked()
    expect(page.locator("#block-hint")).to_have_text(
        "This text is placed in the assistant's instructions on every turn."
    )
    person.open_history()
    page.uncheck("#memory-enabled")
    expect(page.locator("#settings-status")).to_contain_text("Memory is off")
    # The Memory card no longer says the text is loaded on every turn.
    expect(page.locator("#block-hint")).to_contain_text(
        "Memory is off: this text is not placed in the assistant's instructions"
    )
    settings = person.api.blocks.GetMemorySettings(
        pb.GetMemorySettingsRequest(), metadata=person.who
    ).settings
    assert settings.memory_enabled is False
    first = page.locator("#audit li").first
    expect(first).to_contain_text("You changed the settings")
    expect(first).to_contain_text("Memory turned off")
    expect(page.locator("#audit li").nth(1)).to_contain_text("+ Likes short answers")
    page.check("#memory-enabled")
    expect(page.locator("#settings-status")).to_have_text("Memory is on.")
    expect(page.locator("#block-hint")).to_contain_text("on every turn")
    # Off is read back as off after a reload (still signed in for this tab).
    page.uncheck("#memory-enabled")
    expect(page.locator("#settings-status")).to_contain_text("Memory is off")
    page.reload()
    expect(page.locator("#account")).to_be_visible()
    expect(page.locator("#block-hint")).to_contain_text("Memory is off")


def test_errors_are_sentences(person: Person) -> None:
    assert person.api.running.web is not None
    page = person.page
    page.goto(f"http://127.0.0.1:{person.api.running.web.port}/")
    page.check("#mode-token")
    page.fill("#token", "not-a-token")
    page.click("#connect")
    expect(page.locator("#sign-in-status")).to_contain_text("You are not signed in")
    expect(page.locator("#sign-in-status")).not_to_contain_text("unauthenticated")


def test_conversations_inspector_delete_and_erase(person: Person) -> None:
    api = person.api
    _model_writes(person, "Uses account acct-4821")
    turn = memory_block_pb2.TurnReference(conversation_id="c-1", turn_id="1")
    api.search.IndexTurn(
        search_pb.IndexTurnRequest(
            conversation_id="c-1",
            turn_id="1",
            question="Which account did the refund go to?",
            answer="To acct-4821.",
            turn_time=Timestamp(seconds=1_793_000_000),
            wait=True,
        ),
        metadata=person.who,
    )
    # The turn's own calls, carrying the turn reference: a render and a search.
    api.blocks.RenderMemoryBlock(pb.RenderMemoryBlockRequest(turn=turn), metadata=person.who)
    api.search.SearchConversations(
        search_pb.SearchConversationsRequest(query="acct-4821", turn=turn), metadata=person.who
    )
    page = person.open()
    conversation = page.locator("#conversations li[data-conversation='c-1']")
    expect(conversation).to_contain_text("1 turn")
    expect(conversation.locator(".title")).to_have_text("Which account did the refund go to?")
    conversation.locator("button.open-conversation").click()
    conversation.locator("button.inspect").click()
    expect(page.locator("#inspection")).to_be_visible()
    expect(page.locator("#inspection .render")).to_contain_text("22 characters (the same as now)")
    expect(page.locator("#inspection .search")).to_contain_text("acct-4821")
    expect(page.locator("#inspection .search li").first).to_contain_text("c-1 turn 1")

    # Delete asks once more, then the conversation is gone for search too, and so is the
    # inspector that showed one of its turns.
    conversation.locator("button.delete-conversation").click()
    expect(conversation.locator(".delete-confirm")).to_be_visible()
    assert page.locator("#conversations li[data-conversation='c-1']").count() == 1
    conversation.locator("button.confirm-delete").click()
    expect(page.locator("#conversations li[data-conversation='c-1']")).to_have_count(0)
    expect(page.locator("#conversations-status")).to_have_text(
        "“Which account did the refund go to?” was deleted."
    )
    expect(page.locator("#inspection")).to_be_hidden()
    expect(page.locator("#inspection-body")).to_be_empty()
    hits = api.search.SearchConversations(
        search_pb.SearchConversationsRequest(query="acct-4821"), metadata=person.who
    ).hits
    assert list(hits) == []

    page.click("#erase")
    expect(page.locator("#erase-confirm")).to_be_visible()
    page.click("#erase-yes")
    expect(page.locator("#erase-status")).to_contain_text("All your data was erased.")
    assert _stored(person).etag == ""
    events = api.audit.ListAuditEvents(audit_pb.ListAuditEventsRequest(), metadata=person.who)
    assert events.events[0].action == audit_pb.AUDIT_ACTION_PRINCIPAL_DATA_ERASED


def _turn(person: Person, conversation: str, turn: str, seconds: int, question: str) -> None:
    person.api.search.IndexTurn(
        search_pb.IndexTurnRequest(
            conversation_id=conversation,
            turn_id=turn,
            question=question,
            answer=f"Answer to {question}",
            turn_time=Timestamp(seconds=seconds),
        ),
        metadata=person.who,
    )


def test_conversations_listed_newest_first_and_read(person: Person) -> None:
    day = 86_400
    start = 1_793_000_000  # 2026-10-26
    # 21 conversations (one more than a page), one a day; c-05 gets a later turn with markup.
    for n in range(21):
        _turn(person, f"c-{n:02}", "1", start + n * day, f"Question number {n}")
    _turn(person, "c-05", "2", start + 30 * day, "<img src=x onerror=alert(1)> still text?")
    page = person.open()
    items = page.locator("#conversations > li")
    expect(items).to_have_count(20)
    titles = items.locator(".title")
    expect(titles.first).to_have_text("Question number 5")  # its last turn is the newest
    expect(titles.nth(1)).to_have_text("Question number 20")
    expect(titles.nth(19)).to_have_text("Question number 1")
    newest = page.locator("#conversations li[data-conversation='c-05']")
    expect(newest).to_contain_text("2 turns")
    started = page.evaluate(f"new Date({(start + 5 * day) * 1000}).toLocaleDateString()")
    expect(newest.locator(".conversation-head")).to_contain_text(started)
    # The next page: the oldest.
    page.click("#conversations-more")
    expect(items).to_have_count(21)
    expect(titles.nth(20)).to_have_text("Question number 0")
    expect(page.locator("#conversations-more")).to_be_hidden()
    # The button that had focus is gone with the last page: focus is on the first one it added.
    oldest = page.locator("#conversations li[data-conversation='c-00'] button.open-conversation")
    expect(oldest).to_be_focused()

    # Open the newest: its turns oldest first, as text (the markup is not an element).
    newest.locator("button.open-conversation").click()
    expect(newest.locator("button.open-conversation")).to_have_attribute("aria-expanded", "true")
    turns = newest.locator(".turn")
    expect(turns).to_have_count(2)
    expect(turns.nth(0).locator(".turn-text")).to_have_text(
        "Question number 5\n\nAnswer to Question number 5"
    )
    expect(turns.nth(1).locator(".turn-text")).to_contain_text("<img src=x onerror=alert(1)>")
    assert newest.locator(".turn-text img").count() == 0
    newest.locator(".turn[data-turn='2'] button.inspect").click()
    expect(page.locator("#inspection-title")).to_have_text("What turn 2 of c-05 used")
    newest.locator("button.open-conversation").click()
    expect(newest.locator(".turns")).to_be_hidden()


def test_a_long_conversation_reads_page_by_page(person: Person) -> None:
    for n in range(23):
        _turn(person, "long", f"t{n:02}", 1_793_000_000 + n * 60, f"Step {n}")
    page = person.open()
    conversation = page.locator("#conversations li[data-conversation='long']")
    expect(conversation).to_contain_text("23 turns")
    conversation.locator("button.open-conversation").click()
    expect(conversation.locator(".turn")).to_have_count(20)
    conversation.locator("button.more-turns").press("Enter")  # from the keyboard
    expect(conversation.locator(".turn")).to_have_count(23)
    expect(conversation.locator(".turn[data-turn='t20'] button.inspect")).to_be_focused()
    expect(conversation.locator(".turn").last).to_have_attribute("data-turn", "t22")
    expect(conversation.locator("button.more-turns")).to_have_count(0)
