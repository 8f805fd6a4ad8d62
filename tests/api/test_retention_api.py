"""Turn retention end to end (issue 24, item 4), on SQLite and PostgreSQL: a server configured
with a tenant's retention (MEMORIA_TENANT_TURN_RETENTION_DAYS) never returns, lists or exports
a turn older than it, its index worker purges it in the background and the tenant's audit
shows the purge as a count; another tenant, with no value and retention off by default, keeps
everything. The clock is the server's own: turns are sent with times in the past (the domain's
rule is tested against a moved clock in tests/contract/test_turn_retention.py).

The policy names only this test's tenant: the PostgreSQL database is shared by the session."""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from memoria.v1 import audit_service_pb2 as audit_pb
from memoria.v1 import conversation_search_service_pb2 as pb
from memoria.v1 import memory_block_pb2 as block_pb
from server.runtime.export_cli import export_lines
from tests.api.conftest import Api, server_settings, serving
from tests.api.test_search_api import PURGE_TIMEOUT_S, index, search
from tests.conftest import SQL_KINDS

NOW = datetime.now(UTC)


@pytest.fixture(params=SQL_KINDS)
def kept(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Api]:
    """A server whose test tenant keeps turns for 30 days (its index worker running)."""
    tenant = f"t-{uuid.uuid4().hex[:10]}"
    settings = server_settings(
        request.param, request, tmp_path, tenant_turn_retention_days={tenant: 30}
    )
    with serving(settings) as api:
        api.tenant = tenant
        yield api


def expired_events(api: Api) -> list[audit_pb.AuditEvent]:
    request = audit_pb.ListAuditEventsRequest(actions=[audit_pb.AUDIT_ACTION_TURNS_EXPIRED])
    return list(api.audit.ListAuditEvents(request, metadata=api.who("ana")).events)


def test_an_expired_turn_is_never_returned_listed_or_exported_and_is_purged(kept: Api) -> None:
    api, ana = kept, kept.who("ana")
    other = api.who("ana", tenant=api.tenant + "-off")  # no value of its own: kept forever
    old, new = NOW - timedelta(days=45), NOW - timedelta(days=2)
    for who in (ana, other):
        index(api, who, "trip", "t-old", "Hotel in Vienna?", "Hotel Sacher.", when=old)
        index(api, who, "trip", "t-new", "Hotel in Graz?", "Hotel Wiesler.", when=new)
        index(api, who, "old-trip", "t1", "Hotel in Linz?", "Hotel Schwarzer Bär.", when=old)

    assert sorted(h.turn_id for h in search(api, ana, "hotel")) == ["t-new"]
    assert sorted(h.turn_id for h in search(api, other, "hotel")) == ["t-new", "t-old", "t1"]
    listed = api.search.ListConversations(pb.ListConversationsRequest(), metadata=ana)
    assert [(c.conversation_id, c.turn_count) for c in listed.conversations] == [("trip", 1)]
    turns = api.search.ListConversationTurns(
        pb.ListConversationTurnsRequest(conversation_id="trip"), metadata=ana
    )
    assert [t.turn_id for t in turns.turns] == ["t-new"]
    export = api.search.ExportPrincipalData(pb.ExportPrincipalDataRequest(), metadata=ana)
    assert export.turn_retention_days == 30
    assert [r.turn.turn_id for r in export.records if r.HasField("turn")] == ["t-new"]
    off = api.search.ExportPrincipalData(pb.ExportPrincipalDataRequest(), metadata=other)
    assert off.turn_retention_days == 0 and sum(r.HasField("turn") for r in off.records) == 3
    header = next(export_lines(api.channel, ana))
    assert '"turn_retention_days": 30' in header

    # The worker purges in the background, maybe already between the turns sent above (then
    # in two passes, each audited with its own count).
    deadline = time.monotonic() + PURGE_TIMEOUT_S
    while sum(e.deleted_turn_count for e in expired_events(api)) < 2:
        assert time.monotonic() < deadline, "the expired turns were never purged"
        time.sleep(0.05)  # polling the background worker, bounded
    events = expired_events(api)
    assert sum(e.deleted_turn_count for e in events) == 2
    for event in events:
        assert event.principal_id == "ana" and event.writer == block_pb.WRITER_UNSPECIFIED
        assert event.conversation_id == "" and event.actor_principal_id == ""
        assert not event.HasField("turn") and not event.removed_lines and not event.added_lines
    assert api.running.index.count(api.tenant, "ana") == 1  # the kept turn's chunk
    assert api.running.index.count(api.tenant + "-off", "ana") == 3
    assert [h.turn_id for h in search(api, ana, "Wiesler")] == ["t-new"]
