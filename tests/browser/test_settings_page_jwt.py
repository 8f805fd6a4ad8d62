"""The settings page against a server in jwt mode: the person pastes a token, the page sends
it as `authorization: Bearer`, and the x-memoria-* headers a page could send are ignored."""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator

import jwt
import pytest
from playwright.sync_api import Browser, expect

from memoria.v1 import memory_block_service_pb2 as pb
from tests.api.conftest import Api, server_settings, serving

SECRET = "browser-test-hs256-secret-0123456789abcdef"


@pytest.fixture(scope="module")
def jwt_web(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Api]:
    settings = server_settings(
        "sqlite",
        None,  # type: ignore[arg-type]
        tmp_path_factory.mktemp("jwt-web"),
        http_listen="127.0.0.1:0",
        auth="jwt",
        jwt_hs256_secret=SECRET,
    )
    with serving(settings) as api:
        yield api


def _token(tenant: str, principal: str) -> str:
    claims = {"tenant": tenant, "sub": principal, "exp": int(time.time()) + 300}
    return jwt.encode(claims, SECRET, algorithm="HS256")


def test_a_pasted_token_names_the_person(jwt_web: Api, browser: Browser) -> None:
    assert jwt_web.running.web is not None
    principal = f"p-{uuid.uuid4().hex[:8]}"
    token = _token(jwt_web.tenant, principal)
    context = browser.new_context()
    try:
        page = context.new_page()
        page.goto(f"http://127.0.0.1:{jwt_web.running.web.port}/")
        expect(page.locator("body[data-ready='1']")).to_have_count(1)
        # Headers mode in jwt mode: the server trusts no header, the page says so in words.
        page.check("#mode-headers")
        page.fill("#tenant", jwt_web.tenant)
        page.fill("#principal", principal)
        page.click("#connect")
        expect(page.locator("#sign-in-status")).to_contain_text("You are not signed in")
        expect(page.locator("#account")).to_be_hidden()
        page.check("#mode-token")
        page.fill("#token", token)
        page.click("#connect")
        expect(page.locator("#account")).to_be_visible()
        page.fill("#block", "Signed in with a token")
        page.click("#save")
        expect(page.locator("#block-status")).to_have_text("Saved.")
        # A reload keeps the sign-in for this tab (sessionStorage), never in localStorage.
        page.reload()
        expect(page.locator("#account")).to_be_visible()
        expect(page.locator("#block")).to_have_value("Signed in with a token")
        expect(page.locator("#sign-in-form")).to_be_hidden()
        expect(page.locator("#who")).to_have_text("You are signed in with your access token.")
        assert page.evaluate("sessionStorage.getItem('memoria.token')") == token
        assert page.evaluate("localStorage.length") == 0
        # Sign out forgets it: the tab's storage, the field, what was shown; a reload stays out.
        page.click("#sign-out")
        expect(page.locator("#sign-in-status")).to_have_text("You are signed out of this page.")
        expect(page.locator("#account")).to_be_hidden()
        expect(page.locator("#token")).to_be_focused()
        expect(page.locator("#token")).to_have_value("")
        assert page.locator("#block").input_value() == ""
        assert (
            page.evaluate("Object.keys(sessionStorage).filter(k => k.startsWith('memoria.'))") == []
        )
        page.reload()
        expect(page.locator("body[data-ready='1']")).to_have_count(1)
        expect(page.locator("#sign-in-form")).to_be_visible()
        expect(page.locator("#account")).to_be_hidden()
        # An expired or wrong token stored for the tab: back to the form, with the sentence.
        page.evaluate(
            """() => { sessionStorage.setItem('memoria.mode', 'token');
                       sessionStorage.setItem('memoria.token', 'not-a-token');
                       sessionStorage.setItem('memoria.signedIn', '1'); }"""
        )
        page.reload()
        expect(page.locator("#sign-in-status")).to_contain_text("You are not signed in")
        expect(page.locator("#sign-in-form")).to_be_visible()
        assert page.evaluate("sessionStorage.getItem('memoria.signedIn')") is None
    finally:
        context.close()
    stored = jwt_web.blocks.GetMemoryBlock(
        pb.GetMemoryBlockRequest(), metadata=(("authorization", f"Bearer {token}"),)
    )
    assert stored.memory_block.text == "Signed in with a token"
