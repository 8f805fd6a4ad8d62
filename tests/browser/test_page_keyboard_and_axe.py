"""The settings page used by keyboard alone, checked by axe-core, and laid out for a screen
(issue 24 item 5): the main flows with page.keyboard only, focus landing where it should and
each outcome said in its own section's live region; no serious or critical axe violation in
the page's main states; Save and its outcome in the first screen of a 1280x800 window."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from google.protobuf.timestamp_pb2 import Timestamp
from playwright.sync_api import Page, ViewportSize, expect

from memoria.v1 import conversation_search_service_pb2 as search_pb
from memoria.v1 import memory_block_pb2
from memoria.v1 import memory_block_service_pb2 as pb
from tests.browser.conftest import Person

AXE = Path(__file__).resolve().parents[2] / "web" / "node_modules" / "axe-core" / "axe.min.js"
"""axe-core as npm installed it (pinned in web/package.json; scripts/web.sh's npm ci)."""

DESKTOP: ViewportSize = {"width": 1280, "height": 800}
PHONE: ViewportSize = {"width": 390, "height": 844}


def _model_writes(person: Person, text: str) -> None:
    request = pb.RewriteMemoryBlockRequest(text=text, writer=memory_block_pb2.WRITER_MODEL)
    person.api.blocks.RewriteMemoryBlock(request, metadata=person.who)


def _turn(person: Person, conversation: str, seconds: int, question: str) -> None:
    person.api.search.IndexTurn(
        search_pb.IndexTurnRequest(
            conversation_id=conversation,
            turn_id="1",
            question=question,
            answer=f"Answer to {question}",
            turn_time=Timestamp(seconds=seconds),
        ),
        metadata=person.who,
    )


def _tab(page: Page, *, back: bool = False) -> None:
    page.keyboard.press("Shift+Tab" if back else "Tab")


def _blank_page(person: Person) -> Page:
    assert person.api.running.web is not None
    page = person.page
    page.goto(f"http://127.0.0.1:{person.api.running.web.port}/")
    expect(page.locator("body[data-ready='1']")).to_have_count(1)
    return page


def test_the_main_flows_by_keyboard_alone(person: Person) -> None:
    _model_writes(person, "Preferred name: Ana")
    _turn(person, "c-old", 1_793_000_000, "What did we book in March?")
    _turn(person, "c-new", 1_793_086_400, "Which account did the refund go to?")
    page = _blank_page(person)
    requests: list[str] = []
    page.on("request", lambda request: requests.append(request.url))

    # Sign in: on loopback the page starts on "Tenant and person". An empty tenant is named,
    # with focus on it, and nothing is sent.
    _tab(page)
    expect(page.locator("#mode-headers")).to_be_focused()
    _tab(page)
    expect(page.locator("#tenant")).to_be_focused()
    _tab(page)
    page.keyboard.type(person.principal)
    _tab(page)
    expect(page.locator("#connect")).to_be_focused()
    page.keyboard.press("Enter")
    expect(page.locator("#sign-in-status")).to_have_text(
        "The tenant is missing: type your tenant (your organisation on this server) to sign in."
    )
    expect(page.locator("#tenant")).to_be_focused()
    expect(page.locator("#tenant")).to_have_attribute("aria-invalid", "true")
    assert [url for url in requests if "/memoria.v1." in url] == []
    page.keyboard.type(person.api.tenant)
    _tab(page)
    _tab(page)
    expect(page.locator("#connect")).to_be_focused()
    page.keyboard.press("Enter")
    expect(page.locator("#sign-in-status")).to_have_text("Signed in. Your memory is below.")
    # The form that had focus is gone: focus is on the memory itself.
    expect(page.locator("#block")).to_be_focused()
    expect(page.locator("#who")).to_have_text(
        f"You are {person.principal} of tenant {person.api.tenant}."
    )

    # Edit and Save: the outcome is said beside Save, focus stays on it.
    page.keyboard.press("Control+End")
    page.keyboard.type("\nLikes tea")
    _tab(page)
    expect(page.locator("#save")).to_be_focused()
    page.keyboard.press("Enter")
    expect(page.locator("#block-status")).to_have_text("Saved.")
    expect(page.locator("#save")).to_be_focused()
    stored = person.api.blocks.GetMemoryBlock(pb.GetMemoryBlockRequest(), metadata=person.who)
    assert stored.memory_block.text == "Preferred name: Ana\nLikes tea"

    # Clear all asks first, with focus on Cancel (a second Enter destroys nothing), and Cancel
    # gives focus back.
    _tab(page)
    expect(page.locator("#clear")).to_be_focused()
    page.keyboard.press("Enter")
    expect(page.locator("#clear-confirm")).to_be_visible()
    expect(page.locator("#clear-no")).to_be_focused()
    page.keyboard.press("Enter")
    expect(page.locator("#clear-confirm")).to_be_hidden()
    expect(page.locator("#clear")).to_be_focused()

    # Open the history: a disclosure that keeps focus and says what it shows.
    _tab(page)
    expect(page.locator("#memory-enabled")).to_be_focused()
    _tab(page)
    expect(page.locator("#history-toggle")).to_be_focused()
    page.keyboard.press("Enter")
    expect(page.locator("#history-toggle")).to_have_attribute("aria-expanded", "true")
    expect(page.locator("#history-status")).to_have_text("2 changes shown, newest first.")
    expect(page.locator("#audit li").first).to_contain_text("You changed the memory")
    expect(page.locator("#history-toggle")).to_be_focused()

    # Open the newest conversation and its first turn's inspector.
    newest = page.locator("#conversations li[data-conversation='c-new']")
    _tab(page)
    expect(newest.locator("button.open-conversation")).to_be_focused()
    page.keyboard.press("Enter")
    expect(newest.locator("button.open-conversation")).to_have_attribute("aria-expanded", "true")
    expect(page.locator("#conversations-status")).to_have_text(
        "“Which account did the refund go to?”: 1 turn shown below."
    )
    _tab(page)
    expect(newest.locator("button.delete-conversation")).to_be_focused()
    _tab(page)
    expect(newest.locator("button.inspect")).to_be_focused()
    page.keyboard.press("Enter")
    expect(page.locator("#inspection-title")).to_be_focused()
    expect(page.locator("#inspection-title")).to_have_text("What turn 1 of c-new used")
    _tab(page)
    expect(page.locator("#inspection-close")).to_be_focused()
    page.keyboard.press("Enter")  # Close: back to the button that opened it
    expect(page.locator("#inspection")).to_be_hidden()
    expect(newest.locator("button.inspect")).to_be_focused()

    # Delete it: the confirmation takes focus on Cancel; Yes deletes, the outcome is said in
    # the list's region and focus goes on to the next conversation.
    page.keyboard.press("Enter")  # the inspector again, to see it closed by the delete
    expect(page.locator("#inspection-title")).to_be_focused()
    newest.locator("button.inspect").focus()
    _tab(page, back=True)
    expect(newest.locator("button.delete-conversation")).to_be_focused()
    page.keyboard.press("Enter")
    expect(newest.locator(".delete-confirm")).to_be_visible()
    expect(newest.locator("button.cancel-delete")).to_be_focused()
    _tab(page, back=True)
    expect(newest.locator("button.confirm-delete")).to_be_focused()
    page.keyboard.press("Enter")
    expect(page.locator("#conversations li[data-conversation='c-new']")).to_have_count(0)
    expect(page.locator("#conversations-status")).to_have_text(
        "“Which account did the refund go to?” was deleted."
    )
    older = page.locator("#conversations li[data-conversation='c-old'] button.open-conversation")
    expect(older).to_be_focused()
    expect(page.locator("#inspection")).to_be_hidden()
    expect(page.locator("#audit li").first).to_contain_text("Conversation c-new (1 turn)")


def _axe_violations(page: Page) -> list[dict[str, object]]:
    """axe-core's violations on the page as it is now.

    The page's Content-Security-Policy allows only its own script, so a <script> tag added with
    axe's text would be refused; page.evaluate runs it through the DevTools protocol, which the
    policy does not govern, so the page is checked under its real policy (no bypass_csp)."""
    if not AXE.is_file():
        pytest.fail(f"no axe-core at {AXE}: run scripts/web.sh (its npm ci installs it)")
    if not page.evaluate("typeof window.axe === 'object'"):
        page.evaluate(AXE.read_text())
    return page.evaluate(  # type: ignore[no-any-return]
        """async () => (await axe.run(document)).violations.map(v => ({
            id: v.id, impact: v.impact, help: v.help,
            nodes: v.nodes.map(n => n.target.join(" ")),
        }))"""
    )


def _assert_accessible(page: Page, state: str) -> None:
    serious = [v for v in _axe_violations(page) if v["impact"] in ("serious", "critical")]
    assert serious == [], f"{state}: {json.dumps(serious, indent=1)}"


def test_axe_finds_nothing_serious_in_the_main_states(person: Person) -> None:
    _model_writes(person, "Preferred name: Ana\n- window seat\n- Window seat")
    _turn(person, "c-1", 1_793_000_000, "<b>Which</b> account got the refund?")
    page = _blank_page(person)
    csp = page.evaluate("async () => (await fetch('/')).headers.get('content-security-policy')")
    assert "script-src 'self'" in csp  # checked under the page's own policy
    _assert_accessible(page, "signed out")
    page.check("#mode-headers")
    page.click("#connect")  # an empty tenant: the error state
    expect(page.locator("#sign-in-status")).to_contain_text("The tenant is missing")
    _assert_accessible(page, "a sign-in error")
    person.open()
    expect(page.locator("#lines li.duplicate")).to_have_count(2)
    _assert_accessible(page, "signed in with a block")
    page.click("#clear")
    _assert_accessible(page, "a confirmation open")
    page.click("#clear-no")
    person.open_history()
    _assert_accessible(page, "history open")
    conversation = page.locator("#conversations li[data-conversation='c-1']")
    conversation.locator("button.open-conversation").click()
    conversation.locator("button.inspect").click()
    expect(page.locator("#inspection")).to_be_visible()
    _assert_accessible(page, "a conversation and its inspector open")
    page.uncheck("#memory-enabled")
    expect(page.locator("#block-hint")).to_contain_text("Memory is off")
    _assert_accessible(page, "memory off")


def test_save_and_its_outcome_fit_the_first_screen(person: Person) -> None:
    _model_writes(person, "Preferred name: Ana\nLikes short answers")
    _turn(person, "c-1", 1_793_000_000, "Which account did the refund go to?")
    page = person.page
    page.set_viewport_size(DESKTOP)
    person.open()
    page.click("#save")
    expect(page.locator("#block-status")).to_have_text(
        "Nothing to save: your memory already says exactly this."
    )
    for selector in ("#save", "#block-status"):
        box = page.locator(selector).bounding_box()
        assert box is not None and box["y"] + box["height"] <= DESKTOP["height"], selector
    assert page.evaluate("window.scrollY") == 0
    page.screenshot(path="/tmp/page-1280.png")
    page.set_viewport_size(PHONE)
    # On a phone each id stays whole on one line (the tenant's moves down whole rather than
    # breaking after its hyphen, where "t-" and the rest read as two words).
    ids = page.locator("#who .id")
    expect(ids).to_have_count(2)
    for span in ids.all():
        lines = span.evaluate(
            "e => { const r = document.createRange(); r.selectNodeContents(e);"
            " return new Set([...r.getClientRects()].map(b => Math.round(b.top))).size; }"
        )
        assert lines == 1, span.text_content()
    page.screenshot(path="/tmp/page-390.png")
    page.screenshot(path="/tmp/page-390-full.png", full_page=True)


def test_erase_closes_the_inspector_and_says_what_the_history_keeps(person: Person) -> None:
    _turn(person, "c-1", 1_793_000_000, "Which account did the refund go to?")
    page = person.open()
    expect(page.locator("#erase-section .hint")).to_contain_text(
        "The history stays: who changed your memory and when, and this erasure, with counts only"
    )
    conversation = page.locator("#conversations li[data-conversation='c-1']")
    conversation.locator("button.open-conversation").click()
    conversation.locator("button.inspect").click()
    expect(page.locator("#inspection")).to_be_visible()
    page.click("#erase")
    expect(page.locator("#erase-no")).to_be_focused()
    page.click("#erase-yes")
    expect(page.locator("#erase-status")).to_have_text(
        "All your data was erased. The history keeps who changed what and when, with counts only."
    )
    expect(page.locator("#inspection")).to_be_hidden()
    expect(page.locator("#inspection-body")).to_be_empty()
    expect(page.locator("#conversations")).to_have_text("No past conversations.")
    expect(page.locator("#erase")).to_be_focused()
    person.open_history()
    expect(page.locator("#audit li").first).to_contain_text("You erased all data")
    expect(page.locator("#audit li").first).to_contain_text("0 lines and 1 turn removed")
