"""The audit log through the API (DESIGN 1, 2 and 5), on SQLite and PostgreSQL.

Every effective write appends exactly one event with its action, writer, principal, time and
changed lines (each cut to 200 code points); a delete keeps only a line count. Events come
newest first in pages bound to the caller and the filters by a signed token. A principal reads
its own events; a tenant administrator may read any principal's of its own tenant, never
another tenant's.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import UTC, datetime, timedelta
from functools import partial

import grpc
import pytest
from google.protobuf.timestamp_pb2 import Timestamp

from memoria.v1 import audit_service_pb2 as audit_pb
from memoria.v1 import memory_block_pb2 as block_pb
from memoria.v1 import memory_block_service_pb2 as pb
from tests.api.conftest import ON_POOLER_AND_CITUS, Api, Metadata, expect_error, field_violations

USER = block_pb.WRITER_USER
MODEL = block_pb.WRITER_MODEL
REWRITTEN = audit_pb.AUDIT_ACTION_BLOCK_REWRITTEN
DELETED = audit_pb.AUDIT_ACTION_BLOCK_DELETED
SETTINGS = audit_pb.AUDIT_ACTION_SETTINGS_UPDATED
ADMIN = "memoria-admin"


def rewrite(api: Api, md: Metadata, text: str, writer: block_pb.Writer.ValueType = USER) -> None:
    request = pb.RewriteMemoryBlockRequest(text=text, writer=writer)
    assert api.blocks.RewriteMemoryBlock(request, metadata=md).changed


def delete(api: Api, md: Metadata, writer: block_pb.Writer.ValueType = USER) -> None:
    request = pb.DeleteMemoryBlockRequest(writer=writer)
    assert api.blocks.DeleteMemoryBlock(request, metadata=md).deleted


def set_enabled(
    api: Api, md: Metadata, enabled: bool, writer: block_pb.Writer.ValueType = USER
) -> None:
    request = pb.UpdateMemorySettingsRequest(memory_enabled=enabled, writer=writer)
    api.blocks.UpdateMemorySettings(request, metadata=md)


def list_page(
    api: Api, md: Metadata, request: audit_pb.ListAuditEventsRequest | None = None
) -> audit_pb.ListAuditEventsResponse:
    return api.audit.ListAuditEvents(request or audit_pb.ListAuditEventsRequest(), metadata=md)


def all_events(
    api: Api, md: Metadata, request: audit_pb.ListAuditEventsRequest | None = None
) -> list[audit_pb.AuditEvent]:
    """Every event the request selects, following page tokens."""
    request = request or audit_pb.ListAuditEventsRequest()
    events: list[audit_pb.AuditEvent] = []
    while True:
        page = list_page(api, md, request)
        events.extend(page.events)
        if not page.next_page_token:
            return events
        following = audit_pb.ListAuditEventsRequest()
        following.CopyFrom(request)  # the same filters, the next page
        following.page_token = page.next_page_token
        request = following


def ids(events: Sequence[audit_pb.AuditEvent]) -> list[str]:
    return [e.event_id for e in events]


def times(events: Sequence[audit_pb.AuditEvent]) -> list[datetime]:
    return [e.create_time.ToDatetime(tzinfo=UTC) for e in events]


# --- what each change records ------------------------------------------------------------


@ON_POOLER_AND_CITUS
def test_a_rewrite_appends_one_event_with_the_changed_lines(api: Api) -> None:
    md = api.who("alice")
    before = datetime.now(UTC)
    rewrite(api, md, "Name: Ada\nLikes tea", writer=MODEL)
    after = datetime.now(UTC)

    (event,) = list_page(api, md).events
    assert event.event_id
    assert event.action == REWRITTEN
    assert event.writer == MODEL
    assert event.principal_id == "alice"
    assert event.HasField("create_time")
    assert before - timedelta(seconds=1) <= times([event])[0] <= after + timedelta(seconds=1)
    assert list(event.removed_lines) == []
    assert list(event.added_lines) == ["Name: Ada", "Likes tea"]
    assert (event.removed_line_count, event.added_line_count) == (0, 2)
    assert event.char_count == len("Name: Ada\nLikes tea")
    assert not event.HasField("memory_enabled")


def test_a_second_rewrite_records_only_the_changed_lines(api: Api) -> None:
    md = api.who("alice")
    rewrite(api, md, "keep\nold 1\nold 2")
    rewrite(api, md, "keep\nnew 1", writer=USER)

    newest, oldest = list_page(api, md).events
    assert oldest.action == newest.action == REWRITTEN
    assert newest.writer == USER
    assert list(newest.removed_lines) == ["old 1", "old 2"]
    assert list(newest.added_lines) == ["new 1"]
    assert (newest.removed_line_count, newest.added_line_count) == (2, 1)
    assert newest.char_count == len("keep\nnew 1")
    assert int(newest.event_id) != int(oldest.event_id)


def test_a_delete_records_only_how_many_lines_it_removed(api: Api) -> None:
    md = api.who("alice")
    secret = "Secret: the vault code is 4821"
    rewrite(api, md, f"Name: Ada\n{secret}\nLikes tea")
    delete(api, md, writer=USER)

    event = list_page(api, md).events[0]
    assert event.action == DELETED
    assert event.writer == USER
    assert event.principal_id == "alice"
    assert event.HasField("create_time")
    assert event.removed_line_count == 3
    assert list(event.removed_lines) == []
    assert list(event.added_lines) == []
    assert event.added_line_count == 0
    assert event.char_count == 0
    assert not event.HasField("memory_enabled")
    # Nothing of the deleted content is kept in any event, in any field: the earlier rewrite's
    # lines were blanked with the delete, while its counts remain.
    events = list_page(api, md).events
    assert all(b"vault" not in e.SerializeToString() for e in events)
    earlier = events[1]
    assert earlier.action == REWRITTEN
    assert (list(earlier.added_lines), earlier.added_line_count) == ([], 3)


def test_a_delete_blanks_only_its_own_principals_lines(api: Api) -> None:
    rewrite(api, api.who("alice"), "alice's line")
    rewrite(api, api.who("bob"), "bob's line")
    rewrite(api, api.who("alice", tenant=api.tenant + "-other"), "other tenant's alice")
    delete(api, api.who("alice"), writer=USER)
    assert list(list_page(api, api.who("bob")).events[0].added_lines) == ["bob's line"]
    other = list_page(api, api.who("alice", tenant=api.tenant + "-other")).events[0]
    assert list(other.added_lines) == ["other tenant's alice"]


def test_a_settings_change_records_the_new_value(api: Api) -> None:
    md = api.who("alice")
    set_enabled(api, md, False, writer=MODEL)
    set_enabled(api, md, True, writer=USER)

    enabled, disabled = list_page(api, md).events
    assert disabled.action == enabled.action == SETTINGS
    assert disabled.HasField("memory_enabled")
    assert not disabled.memory_enabled
    assert disabled.writer == MODEL
    assert enabled.HasField("memory_enabled")
    assert enabled.memory_enabled
    assert enabled.writer == USER
    assert enabled.principal_id == "alice"
    assert list(enabled.added_lines) == list(enabled.removed_lines) == []


def test_changes_that_change_nothing_or_fail_record_nothing(api: Api) -> None:
    md = api.who("alice")
    rewrite(api, md, "Name: Ada")
    assert len(list_page(api, md).events) == 1

    api.blocks.RewriteMemoryBlock(  # identical
        pb.RewriteMemoryBlockRequest(text="Name: Ada", writer=USER), metadata=md
    )
    set_enabled(api, md, True)  # already on
    api.blocks.UpdateMemorySettings(  # nothing set
        pb.UpdateMemorySettingsRequest(writer=USER), metadata=md
    )
    for text, etag in (("", None), ("x" * 4001, None), ("Name: Bob", "stale")):
        with pytest.raises(grpc.RpcError):
            api.blocks.RewriteMemoryBlock(
                pb.RewriteMemoryBlockRequest(text=text, writer=USER, etag=etag), metadata=md
            )
    set_enabled(api, md, False)
    with pytest.raises(grpc.RpcError):
        rewrite(api, md, "Name: Bob", writer=MODEL)

    assert [e.action for e in list_page(api, md).events] == [SETTINGS, REWRITTEN]


def test_changed_lines_are_cut_to_200_code_points(api: Api) -> None:
    md = api.who("alice")
    long_ascii = "y" * 250
    exactly_200 = "z" * 200
    long_emoji = "\U0001f600" * 250  # astral: 250 code points, 500 UTF-16 units
    response = api.blocks.RewriteMemoryBlock(
        pb.RewriteMemoryBlockRequest(
            text=f"{long_ascii}\n{exactly_200}\n{long_emoji}", writer=USER
        ),
        metadata=md,
    )
    # The caller's own diff is whole; only the audit copy is cut.
    assert list(response.added_lines) == [long_ascii, exactly_200, long_emoji]

    rewrite(api, md, "short")
    newest, oldest = list_page(api, md).events
    assert list(oldest.added_lines) == ["y" * 199 + "…", exactly_200, "\U0001f600" * 199 + "…"]
    assert all(len(line) <= 200 for line in oldest.added_lines)
    assert list(newest.removed_lines) == ["y" * 199 + "…", exactly_200, "\U0001f600" * 199 + "…"]
    assert newest.removed_line_count == 3


def test_events_are_listed_newest_first(api: Api) -> None:
    md = api.who("alice")
    rewrite(api, md, "one")
    set_enabled(api, md, False)
    rewrite(api, md, "two")
    delete(api, md)
    set_enabled(api, md, True)

    events = list_page(api, md).events
    assert [e.action for e in events] == [SETTINGS, DELETED, REWRITTEN, SETTINGS, REWRITTEN]
    assert times(events) == sorted(times(events), reverse=True)
    assert len(set(ids(events))) == 5


# --- paging ------------------------------------------------------------------------------


@ON_POOLER_AND_CITUS
def test_pages_cover_every_event_once_in_order(api: Api) -> None:
    md = api.who("alice")
    for i in range(7):
        rewrite(api, md, f"version {i}")
    everything = list_page(api, md).events
    assert len(everything) == 7
    assert not list_page(api, md).next_page_token

    pages: list[audit_pb.ListAuditEventsResponse] = []
    token = ""
    while True:
        page = list_page(api, md, audit_pb.ListAuditEventsRequest(page_size=3, page_token=token))
        pages.append(page)
        token = page.next_page_token
        if not token:
            break
        assert len(pages) < 10, "paging does not end"

    assert [len(p.events) for p in pages] == [3, 3, 1]
    assert [bool(p.next_page_token) for p in pages] == [True, True, False]
    paged = [e for p in pages for e in p.events]
    assert ids(paged) == ids(everything)
    assert [list(e.added_lines) for e in paged] == [[f"version {i}"] for i in range(6, -1, -1)]


def test_a_page_that_ends_exactly_at_the_last_event_has_no_token(api: Api) -> None:
    md = api.who("alice")
    for i in range(6):
        rewrite(api, md, f"version {i}")
    first = list_page(api, md, audit_pb.ListAuditEventsRequest(page_size=3))
    second = list_page(
        api, md, audit_pb.ListAuditEventsRequest(page_size=3, page_token=first.next_page_token)
    )
    assert len(second.events) == 3
    assert second.next_page_token == ""


def test_page_size_zero_means_fifty(api: Api) -> None:
    md = api.who("alice")
    for i in range(51):
        rewrite(api, md, f"version {i}")
    page = list_page(api, md, audit_pb.ListAuditEventsRequest(page_size=0))
    assert len(page.events) == 50
    assert page.next_page_token
    rest = list_page(api, md, audit_pb.ListAuditEventsRequest(page_token=page.next_page_token))
    assert list(rest.events[0].added_lines) == ["version 0"]
    assert rest.next_page_token == ""


def test_a_page_size_over_500_is_capped_not_refused(api: Api) -> None:
    md = api.who("alice")
    rewrite(api, md, "one")
    page = list_page(api, md, audit_pb.ListAuditEventsRequest(page_size=1_000_000))
    assert len(page.events) == 1
    assert page.next_page_token == ""


def test_a_negative_page_size_is_invalid(api: Api) -> None:
    error = expect_error(
        lambda: list_page(api, api.who("alice"), audit_pb.ListAuditEventsRequest(page_size=-1)),
        grpc.StatusCode.INVALID_ARGUMENT,
        "ERROR_REASON_INVALID_ARGUMENT",
    )
    assert "page_size" in field_violations(error)


def _first_token(api: Api, md: Metadata, request: audit_pb.ListAuditEventsRequest) -> str:
    page = list_page(api, md, request)
    assert page.next_page_token
    return page.next_page_token


def test_a_token_is_bound_to_its_filters(api: Api) -> None:
    md = api.who("alice")
    for i in range(3):
        rewrite(api, md, f"version {i}")
    token = _first_token(api, md, audit_pb.ListAuditEventsRequest(page_size=1))

    other_filters = [
        audit_pb.ListAuditEventsRequest(page_size=1, page_token=token, actions=[REWRITTEN]),
        audit_pb.ListAuditEventsRequest(
            page_size=1, page_token=token, start_time=Timestamp(seconds=1)
        ),
        audit_pb.ListAuditEventsRequest(
            page_size=1, page_token=token, end_time=Timestamp(seconds=4_000_000_000)
        ),
        audit_pb.ListAuditEventsRequest(page_size=1, page_token=token, principal_id="alice-2"),
    ]
    admin_md = api.who("alice", roles=ADMIN)
    for request in other_filters:
        caller = admin_md if request.principal_id else md
        error = expect_error(
            partial(list_page, api, caller, request),
            grpc.StatusCode.INVALID_ARGUMENT,
            "ERROR_REASON_INVALID_PAGE_TOKEN",
        )
        assert "page_token" in field_violations(error)

    # With the same filters (page_size may change) the token is good.
    page = list_page(api, md, audit_pb.ListAuditEventsRequest(page_size=5, page_token=token))
    assert [list(e.added_lines) for e in page.events] == [["version 1"], ["version 0"]]


def test_a_token_is_bound_to_its_caller(api: Api) -> None:
    alice, bob = api.who("alice"), api.who("bob")
    for i in range(2):
        rewrite(api, alice, f"alice {i}")
        rewrite(api, bob, f"bob {i}")
    token = _first_token(api, alice, audit_pb.ListAuditEventsRequest(page_size=1))

    for md in (bob, api.who("alice", tenant=api.tenant + "-other")):
        expect_error(
            partial(
                list_page, api, md, audit_pb.ListAuditEventsRequest(page_size=1, page_token=token)
            ),
            grpc.StatusCode.INVALID_ARGUMENT,
            "ERROR_REASON_INVALID_PAGE_TOKEN",
        )


def _flip(token: str, index: int) -> str:
    replacement = "A" if token[index] != "A" else "B"
    return token[:index] + replacement + token[index + 1 :]


@pytest.mark.parametrize("where", ["start", "middle", "garbage", "not_base64"])
def test_a_tampered_or_made_up_token_is_invalid(api: Api, where: str) -> None:
    md = api.who("alice")
    for i in range(3):
        rewrite(api, md, f"version {i}")
    token = _first_token(api, md, audit_pb.ListAuditEventsRequest(page_size=1))
    bad = {
        "start": _flip(token, 0),
        "middle": _flip(token, len(token) // 2),
        "garbage": "eyJ2IjoxLCJiIjo5OTk5fQ",  # a cursor without a signature
        "not_base64": "!!not a token!!",
    }[where]
    assert bad != token

    expect_error(
        lambda: list_page(api, md, audit_pb.ListAuditEventsRequest(page_size=1, page_token=bad)),
        grpc.StatusCode.INVALID_ARGUMENT,
        "ERROR_REASON_INVALID_PAGE_TOKEN",
    )


# --- filters -----------------------------------------------------------------------------


def test_filter_by_action(api: Api) -> None:
    md = api.who("alice")
    rewrite(api, md, "one")
    delete(api, md)
    set_enabled(api, md, False)
    rewrite(api, md, "two")
    delete(api, md)

    deleted = list_page(api, md, audit_pb.ListAuditEventsRequest(actions=[DELETED])).events
    assert [e.action for e in deleted] == [DELETED, DELETED]

    two_kinds = audit_pb.ListAuditEventsRequest(actions=[SETTINGS, REWRITTEN])
    assert [e.action for e in list_page(api, md, two_kinds).events] == [
        REWRITTEN,
        SETTINGS,
        REWRITTEN,
    ]


def test_an_unspecified_action_filter_is_invalid(api: Api) -> None:
    request = audit_pb.ListAuditEventsRequest(actions=[DELETED, audit_pb.AUDIT_ACTION_UNSPECIFIED])
    error = expect_error(
        lambda: list_page(api, api.who("alice"), request),
        grpc.StatusCode.INVALID_ARGUMENT,
        "ERROR_REASON_INVALID_ARGUMENT",
    )
    assert any(field.startswith("actions") for field in field_violations(error))


def test_filter_by_time_includes_the_start_and_excludes_the_end(api: Api) -> None:
    md = api.who("alice")
    for i in range(5):
        rewrite(api, md, f"version {i}")
    events = list_page(api, md).events  # newest first
    start, end = events[3].create_time, events[1].create_time
    lo, hi = start.ToDatetime(tzinfo=UTC), end.ToDatetime(tzinfo=UTC)
    expected = [e.event_id for e, t in zip(events, times(events), strict=True) if lo <= t < hi]
    assert expected and len(expected) < len(events)

    selected = list_page(
        api, md, audit_pb.ListAuditEventsRequest(start_time=start, end_time=end)
    ).events
    assert ids(selected) == expected
    assert events[3].event_id in ids(selected)
    assert events[1].event_id not in ids(selected)

    since = list_page(api, md, audit_pb.ListAuditEventsRequest(start_time=start)).events
    assert ids(since) == [e.event_id for e, t in zip(events, times(events), strict=True) if t >= lo]
    until = list_page(api, md, audit_pb.ListAuditEventsRequest(end_time=end)).events
    assert ids(until) == [e.event_id for e, t in zip(events, times(events), strict=True) if t < hi]


def test_an_end_time_not_after_the_start_time_is_invalid(api: Api) -> None:
    request = audit_pb.ListAuditEventsRequest(
        start_time=Timestamp(seconds=2_000_000_000), end_time=Timestamp(seconds=1_000_000_000)
    )
    error = expect_error(
        lambda: list_page(api, api.who("alice"), request),
        grpc.StatusCode.INVALID_ARGUMENT,
        "ERROR_REASON_INVALID_ARGUMENT",
    )
    assert "end_time" in field_violations(error)


def test_an_out_of_range_timestamp_is_invalid(api: Api) -> None:
    request = audit_pb.ListAuditEventsRequest(start_time=Timestamp(seconds=10**12))
    error = expect_error(
        lambda: list_page(api, api.who("alice"), request),
        grpc.StatusCode.INVALID_ARGUMENT,
        "ERROR_REASON_INVALID_ARGUMENT",
    )
    assert "start_time" in field_violations(error)


# --- who may read what -------------------------------------------------------------------


@pytest.mark.parametrize("roles", ["", "memoria-reader", "memoria-admins", "not-memoria-admin"])
@pytest.mark.parametrize("principal_id", ["bob", "-"])
def test_a_principal_may_not_read_another_principals_events(
    api: Api, roles: str, principal_id: str
) -> None:
    rewrite(api, api.who("bob"), "bob's block")
    request = audit_pb.ListAuditEventsRequest(principal_id=principal_id)
    expect_error(
        lambda: list_page(api, api.who("alice", roles=roles), request),
        grpc.StatusCode.PERMISSION_DENIED,
        "ERROR_REASON_PERMISSION_DENIED",
    )


def test_a_principal_may_name_itself(api: Api) -> None:
    md = api.who("alice")
    rewrite(api, md, "alice's block")
    events = list_page(api, md, audit_pb.ListAuditEventsRequest(principal_id="alice")).events
    assert [e.principal_id for e in events] == ["alice"]


@ON_POOLER_AND_CITUS
def test_a_tenant_admin_reads_any_principal_of_its_tenant_only(api: Api) -> None:
    other_tenant = api.tenant + "-other"
    for tenant in (api.tenant, other_tenant):
        for principal in ("alice", "bob", "carol"):
            rewrite(api, api.who(principal, tenant=tenant), f"{tenant}/{principal}")
    set_enabled(api, api.who("bob"), False)
    admin = api.who("alice", roles=f"reader {ADMIN}")

    bobs = all_events(api, admin, audit_pb.ListAuditEventsRequest(principal_id="bob"))
    assert [e.action for e in bobs] == [SETTINGS, REWRITTEN]
    assert {e.principal_id for e in bobs} == {"bob"}
    assert list(bobs[1].added_lines) == [f"{api.tenant}/bob"]

    everyone = all_events(api, admin, audit_pb.ListAuditEventsRequest(principal_id="-"))
    assert sorted(e.principal_id for e in everyone) == ["alice", "bob", "bob", "carol"]
    lines = [line for e in everyone for line in e.added_lines]
    assert sorted(lines) == sorted(f"{api.tenant}/{p}" for p in ("alice", "bob", "carol"))
    assert times(everyone) == sorted(times(everyone), reverse=True)

    # The other tenant's admin sees only its own tenant's events, although the ids are equal.
    other_admin = api.who("alice", tenant=other_tenant, roles=ADMIN)
    theirs = all_events(api, other_admin, audit_pb.ListAuditEventsRequest(principal_id="-"))
    assert sorted(line for e in theirs for line in e.added_lines) == sorted(
        f"{other_tenant}/{p}" for p in ("alice", "bob", "carol")
    )

    # An admin of a tenant with no events sees none at all.
    empty = api.who("root", tenant=api.tenant + "-empty", roles=ADMIN)
    assert list_page(api, empty, audit_pb.ListAuditEventsRequest(principal_id="-")).events == []


def test_an_admin_pages_through_every_principal(api: Api) -> None:
    for i in range(4):
        rewrite(api, api.who("bob"), f"bob {i}")
        rewrite(api, api.who("carol"), f"carol {i}")
    admin = api.who("alice", roles=ADMIN)
    first = list_page(api, admin, audit_pb.ListAuditEventsRequest(principal_id="-", page_size=5))
    assert len(first.events) == 5
    rest = list_page(
        api,
        admin,
        audit_pb.ListAuditEventsRequest(
            principal_id="-", page_size=5, page_token=first.next_page_token
        ),
    )
    assert len(rest.events) == 3
    assert rest.next_page_token == ""
    assert len(set(ids(first.events)) | set(ids(rest.events))) == 8
