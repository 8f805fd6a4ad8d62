"""The page's history says, in words, when Memoria removed a person's old turns under the
organization's retention (issue 24 item 4): the audit event carries a count and no writer."""

from __future__ import annotations

import time
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta

import pytest
from playwright.sync_api import expect

from memoria.v1 import audit_service_pb2 as audit_pb
from tests.api.conftest import Api, server_settings, serving
from tests.api.test_search_api import PURGE_TIMEOUT_S, index
from tests.browser.conftest import Person


@pytest.fixture(scope="module")
def web_api(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Api]:
    """This module's server: turns are kept 30 days (the deployment default), page on loopback."""
    tmp_path = tmp_path_factory.mktemp("web-retention")
    settings = server_settings(
        "sqlite",
        None,  # type: ignore[arg-type]  # SQLite needs no fixture
        tmp_path,
        http_listen="127.0.0.1:0",
        turn_retention_days=30,
    )
    with serving(settings) as api:
        yield api


def test_history_says_memoria_removed_turns_past_the_retention(person: Person) -> None:
    api, who = person.api, person.who
    old = datetime.now(UTC) - timedelta(days=45)
    index(api, who, "trip", "t1", "Hotel in Linz?", "Hotel Schwarzer Bär.", when=old)
    request = audit_pb.ListAuditEventsRequest(actions=[audit_pb.AUDIT_ACTION_TURNS_EXPIRED])
    deadline = time.monotonic() + PURGE_TIMEOUT_S
    while not api.audit.ListAuditEvents(request, metadata=who).events:
        assert time.monotonic() < deadline, "the expired turn was never purged"
        time.sleep(0.05)  # polling the background worker, bounded

    page = person.open()
    person.open_history()
    entry = page.locator("#audit li[data-action='TURNS_EXPIRED']")
    expect(entry).to_have_count(1)
    expect(entry).to_contain_text("Memoria removed old conversation turns")
    expect(entry).to_contain_text("1 turn older than your organization keeps them")
    expect(page.locator("#audit")).not_to_contain_text("Someone")
