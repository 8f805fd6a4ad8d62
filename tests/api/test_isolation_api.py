"""Isolation through the API (DESIGN 1): memory never crosses principals or tenants.

Two tenants each have the principals "alice" and "bob" (the same principal ids in both
tenants, so a query that forgot the tenant would mix them up). Each of the four identities
writes a block with its own marker and changes its settings; then every RPC is called as each
identity, and every other identity's data must be unseen and unchanged. On PostgreSQL this
runs as the non-superuser service role, so row-level security is in force as well.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from functools import partial

import grpc
import pytest

from memoria.v1 import audit_service_pb2 as audit_pb
from memoria.v1 import memory_block_pb2 as block_pb
from memoria.v1 import memory_block_service_pb2 as pb
from tests.api.conftest import ON_POOLER_AND_CITUS, Api, Metadata, expect_error

USER = block_pb.WRITER_USER
MODEL = block_pb.WRITER_MODEL
ADMIN = "memoria-admin"
PRINCIPALS = ("alice", "bob")


@dataclass(frozen=True)
class Identity:
    """One of the four callers, and the marker that only its own data may contain."""

    tenant: str
    principal: str

    @property
    def marker(self) -> str:
        return f"marker:{self.tenant}:{self.principal}"

    def block_text(self, version: int = 1) -> str:
        return f"{self.marker}\nversion {version} of {self.principal}'s memory"


@dataclass(frozen=True)
class Snapshot:
    """What one identity has stored, as its own calls see it."""

    text: str
    etag: str
    enabled: bool
    event_ids: tuple[str, ...]


class World:
    """Four identities on one server, with helpers to call as each and to snapshot all."""

    def __init__(self, api: Api):
        self.api = api
        self.identities = [
            Identity(f"{api.tenant}-{suffix}", principal)
            for suffix in ("a", "b")
            for principal in PRINCIPALS
        ]
        # The enabled state each identity ends up with after changing its settings.
        self.enabled = dict(zip(self.identities, (False, True, True, False), strict=True))

    def md(self, who: Identity, roles: str = "") -> Metadata:
        return self.api.who(who.principal, tenant=who.tenant, roles=roles)

    def get(self, who: Identity) -> block_pb.MemoryBlock:
        request = pb.GetMemoryBlockRequest()
        return self.api.blocks.GetMemoryBlock(request, metadata=self.md(who)).memory_block

    def render(self, who: Identity) -> pb.RenderMemoryBlockResponse:
        request = pb.RenderMemoryBlockRequest()
        return self.api.blocks.RenderMemoryBlock(request, metadata=self.md(who))

    def rewrite(
        self, who: Identity, text: str, etag: str | None = None
    ) -> pb.RewriteMemoryBlockResponse:
        request = pb.RewriteMemoryBlockRequest(text=text, writer=USER, etag=etag)
        return self.api.blocks.RewriteMemoryBlock(request, metadata=self.md(who))

    def delete(self, who: Identity, etag: str | None = None) -> pb.DeleteMemoryBlockResponse:
        request = pb.DeleteMemoryBlockRequest(writer=USER, etag=etag)
        return self.api.blocks.DeleteMemoryBlock(request, metadata=self.md(who))

    def settings(self, who: Identity) -> block_pb.MemorySettings:
        request = pb.GetMemorySettingsRequest()
        return self.api.blocks.GetMemorySettings(request, metadata=self.md(who)).settings

    def set_enabled(self, who: Identity, enabled: bool) -> block_pb.MemorySettings:
        request = pb.UpdateMemorySettingsRequest(memory_enabled=enabled, writer=USER)
        return self.api.blocks.UpdateMemorySettings(request, metadata=self.md(who)).settings

    def events(
        self, who: Identity, principal_id: str = "", roles: str = ""
    ) -> list[audit_pb.AuditEvent]:
        request = audit_pb.ListAuditEventsRequest(page_size=500, principal_id=principal_id)
        response = self.api.audit.ListAuditEvents(request, metadata=self.md(who, roles))
        assert not response.next_page_token
        return list(response.events)

    def snapshot(self, who: Identity) -> Snapshot:
        block = self.get(who)
        events = tuple(e.event_id for e in self.events(who))
        return Snapshot(block.text, block.etag, self.settings(who).memory_enabled, events)

    def snapshots(self) -> dict[Identity, Snapshot]:
        return {who: self.snapshot(who) for who in self.identities}

    def others(self, who: Identity) -> Iterator[Identity]:
        return (other for other in self.identities if other != who)


@pytest.fixture
def world(api: Api) -> World:
    """Each identity has written its block and changed its settings at least once."""
    w = World(api)
    for who in w.identities:
        assert w.rewrite(who, who.block_text()).changed
        w.set_enabled(who, False)
        if w.enabled[who]:
            w.set_enabled(who, True)
    return w


def assert_only_own(text: str, who: Identity, world: World) -> None:
    for other in world.others(who):
        assert other.marker not in text


# --- reads -------------------------------------------------------------------------------


def test_get_and_settings_return_only_the_callers_own(world: World) -> None:
    for who in world.identities:
        block = world.get(who)
        assert block.text == who.block_text()
        assert_only_own(block.text, who, world)
        assert world.settings(who).memory_enabled is world.enabled[who]
    etags = {world.get(who).etag for who in world.identities}
    assert len(etags) == 4


@ON_POOLER_AND_CITUS
def test_render_returns_only_the_callers_own(world: World) -> None:
    for who in world.identities:
        rendered = world.render(who)
        if world.enabled[who]:
            assert rendered.prompt_section.endswith("\n" + who.block_text())
            assert rendered.etag == world.get(who).etag
        else:
            assert rendered.prompt_section == ""
        assert_only_own(rendered.prompt_section, who, world)


def test_audit_lists_only_the_callers_own_events(world: World) -> None:
    for who in world.identities:
        events = world.events(who)
        expected_settings = 1 if not world.enabled[who] else 2
        assert len(events) == 1 + expected_settings
        assert {e.principal_id for e in events} == {who.principal}
        lines = "\n".join(line for e in events for line in e.added_lines)
        assert who.marker in lines
        assert_only_own(lines, who, world)


def test_an_admin_lists_only_its_own_tenant(world: World) -> None:
    for admin in world.identities:
        everyone = world.events(admin, principal_id="-", roles=ADMIN)
        tenant_mates = [who for who in world.identities if who.tenant == admin.tenant]
        own_events = {e for who in tenant_mates for e in world.snapshot(who).event_ids}
        assert {e.event_id for e in everyone} == own_events
        lines = "\n".join(line for e in everyone for line in e.added_lines)
        for who in world.identities:
            assert (who.marker in lines) is (who.tenant == admin.tenant)

        for principal in PRINCIPALS:
            named = world.events(admin, principal_id=principal, roles=ADMIN)
            mate = Identity(admin.tenant, principal)
            assert tuple(e.event_id for e in named) == world.snapshot(mate).event_ids


def test_a_non_admin_cannot_list_its_tenant_mates(world: World) -> None:
    alice_a = world.identities[0]
    for principal_id in ("bob", "-"):
        expect_error(
            partial(world.events, alice_a, principal_id=principal_id),
            grpc.StatusCode.PERMISSION_DENIED,
            "ERROR_REASON_PERMISSION_DENIED",
        )


# --- writes ------------------------------------------------------------------------------


@ON_POOLER_AND_CITUS
def test_a_rewrite_changes_only_the_callers_block(world: World) -> None:
    for who in world.identities:
        before = world.snapshots()
        result = world.rewrite(who, who.block_text(2))
        assert result.changed
        assert list(result.removed_lines) == [f"version 1 of {who.principal}'s memory"]
        after = world.snapshots()
        assert after[who].text == who.block_text(2)
        for other in world.others(who):
            assert after[other] == before[other]


def test_another_principals_etag_never_matches(world: World) -> None:
    before = world.snapshots()
    for who in world.identities:
        for other in world.others(who):
            expect_error(
                partial(world.rewrite, who, "overwritten?", etag=before[other].etag),
                grpc.StatusCode.ABORTED,
                "ERROR_REASON_ETAG_MISMATCH",
            )
            expect_error(
                partial(world.delete, who, etag=before[other].etag),
                grpc.StatusCode.ABORTED,
                "ERROR_REASON_ETAG_MISMATCH",
            )
    assert world.snapshots() == before

    # Also when the caller has no block at all, another principal's etag does not match.
    first = world.identities[0]
    world.delete(first)
    for other in world.others(first):
        expect_error(
            partial(world.rewrite, first, "overwritten?", etag=before[other].etag),
            grpc.StatusCode.ABORTED,
            "ERROR_REASON_ETAG_MISMATCH",
        )
    assert world.get(first).etag == ""


def test_a_delete_removes_only_the_callers_block(world: World) -> None:
    deleted: set[Identity] = set()
    for who in reversed(world.identities):
        before = world.snapshots()
        result = world.delete(who)
        assert result.deleted
        assert result.removed_line_count == 2
        deleted.add(who)
        after = world.snapshots()
        assert (after[who].text, after[who].etag) == ("", "")
        for other in world.others(who):
            assert after[other] == before[other]
            assert (after[other].text == "") is (other in deleted)


def test_a_settings_change_changes_only_the_callers_settings(world: World) -> None:
    enabled = dict(world.enabled)
    for who in world.identities:
        before = world.snapshots()
        enabled[who] = not enabled[who]
        assert world.set_enabled(who, enabled[who]).memory_enabled is enabled[who]
        after = world.snapshots()
        assert after[who].enabled is enabled[who]
        for other in world.identities:
            assert (world.render(other).prompt_section != "") is enabled[other]
            if other != who:
                assert after[other] == before[other]


def test_disabling_memory_refuses_only_that_callers_model_writes(world: World) -> None:
    for who in world.identities:
        request = pb.RewriteMemoryBlockRequest(text=who.block_text(3), writer=MODEL)
        call = partial(world.api.blocks.RewriteMemoryBlock, request, metadata=world.md(who))
        if world.enabled[who]:
            assert call().changed
        else:
            expect_error(call, grpc.StatusCode.FAILED_PRECONDITION, "ERROR_REASON_MEMORY_DISABLED")
    for who in world.identities:
        assert world.get(who).text == who.block_text(3 if world.enabled[who] else 1)


# --- identity ----------------------------------------------------------------------------


BAD_HEADERS = {
    "none": [],
    "no_principal": [("x-memoria-tenant", "{tenant}")],
    "no_tenant": [("x-memoria-principal", "alice")],
    "empty_principal": [("x-memoria-tenant", "{tenant}"), ("x-memoria-principal", "")],
    "too_long_principal": [("x-memoria-tenant", "{tenant}"), ("x-memoria-principal", "a" * 257)],
    "two_principals": [
        ("x-memoria-tenant", "{tenant}"),
        ("x-memoria-principal", "alice"),
        ("x-memoria-principal", "bob"),
    ],
}


@pytest.mark.parametrize("headers", BAD_HEADERS.values(), ids=BAD_HEADERS.keys())
def test_a_call_without_a_confirmed_identity_is_unauthenticated(
    api: Api, headers: Metadata
) -> None:
    metadata = tuple((key, value.format(tenant=api.tenant)) for key, value in headers)
    calls: list[Callable[[], object]] = [
        partial(api.blocks.GetMemoryBlock, pb.GetMemoryBlockRequest(), metadata=metadata),
        partial(api.blocks.RenderMemoryBlock, pb.RenderMemoryBlockRequest(), metadata=metadata),
        partial(
            api.blocks.RewriteMemoryBlock,
            pb.RewriteMemoryBlockRequest(text="sneaky", writer=USER),
            metadata=metadata,
        ),
        partial(
            api.blocks.DeleteMemoryBlock,
            pb.DeleteMemoryBlockRequest(writer=USER),
            metadata=metadata,
        ),
        partial(api.blocks.GetMemorySettings, pb.GetMemorySettingsRequest(), metadata=metadata),
        partial(
            api.blocks.UpdateMemorySettings,
            pb.UpdateMemorySettingsRequest(memory_enabled=False, writer=USER),
            metadata=metadata,
        ),
        partial(api.audit.ListAuditEvents, audit_pb.ListAuditEventsRequest(), metadata=metadata),
    ]
    for call in calls:
        expect_error(call, grpc.StatusCode.UNAUTHENTICATED, "ERROR_REASON_UNAUTHENTICATED")

    # Nothing was written for anyone the headers named.
    admin = api.who("alice", roles=ADMIN)
    response = api.audit.ListAuditEvents(
        audit_pb.ListAuditEventsRequest(principal_id="-"), metadata=admin
    )
    assert list(response.events) == []
    for principal in ("alice", "bob"):
        request = pb.GetMemoryBlockRequest()
        block = api.blocks.GetMemoryBlock(request, metadata=api.who(principal)).memory_block
        assert block.etag == ""
