"""Export and import end to end (issue 12, item 4): ExportPrincipalData pages, `memoria export`
and `memoria import` against real servers (the source on SQLite and PostgreSQL, the target a
fresh embedded server): a round trip gives the same data back, a second import changes
nothing, an erased principal's export is empty, and nobody exports anyone else's data."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import grpc
import pytest

from memoria.v1 import audit_service_pb2 as audit_pb
from memoria.v1 import conversation_search_service_pb2 as pb
from memoria.v1 import memory_block_pb2 as block_pb
from memoria.v1 import memory_block_service_pb2 as block_service_pb
from server.runtime.cli import main
from server.runtime.export_cli import export_lines, import_records, parse_lines
from tests.api.conftest import Api, Metadata, expect_error, server_settings, serving
from tests.api.test_search_api import index


def fill(api: Api, who: Metadata) -> None:
    """A block, a settings change, two indexed turns and a deleted conversation."""
    api.blocks.RewriteMemoryBlock(
        block_service_pb.RewriteMemoryBlockRequest(
            text="Preferred name: Ana\nUses Jira account ana-42", writer=block_pb.WRITER_MODEL
        ),
        metadata=who,
    )
    for enabled in (False, True):
        api.blocks.UpdateMemorySettings(
            block_service_pb.UpdateMemorySettingsRequest(
                memory_enabled=enabled, writer=block_pb.WRITER_USER
            ),
            metadata=who,
        )
    index(api, who, "c1", "t1", "Which account got the refund?", "acct-4821, on Monday.")
    index(api, who, "c1", "t2", "Long " * 1200, "answer " * 500)  # two chunks
    index(api, who, "gone", "t1", "Forget this one", "Forgotten.")
    api.search.DeleteConversation(
        pb.DeleteConversationRequest(conversation_id="gone"), metadata=who
    )


def export(api: Api, who: Metadata) -> list[dict[str, Any]]:
    """The caller's export as parsed records (header dropped)."""
    return [{"kind": k, **d} for k, d in parse_lines(export_lines(api.channel, tuple(who)))]


def comparable(records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """What a round trip keeps: everything but audit events (never imported), versions and
    times the target assigns itself (etag, update_time, delete_time), and settings equal to
    the defaults (a settings record says they were changed once; setting memory on where it
    already is changes nothing, so the target has none)."""
    volatile = {"etag", "update_time", "delete_time"}
    return [
        {k: v for k, v in r.items() if k not in volatile}
        for r in records
        if r["kind"] != "audit_event"
        and not (r["kind"] == "settings" and r.get("memory_enabled") is True)
    ]


def test_export_holds_everything_about_the_caller(api: Api) -> None:
    ana = api.who("ana")
    fill(api, ana)
    records = export(api, ana)
    kinds = [r["kind"] for r in records]
    assert kinds[:2] == ["settings", "memory_block"]
    assert kinds[-1] == "deleted_conversation"
    assert records[0]["memory_enabled"] is True
    assert records[1]["text"] == "Preferred name: Ana\nUses Jira account ana-42"
    turns = {(r["conversation_id"], r["turn_id"]): r for r in records if r["kind"] == "turn"}
    assert set(turns) == {("c1", "t1"), ("c1", "t2")}
    assert turns["c1", "t1"]["text"] == "Which account got the refund?\n\nacct-4821, on Monday."
    assert turns["c1", "t1"]["indexed"] is True
    assert (
        turns["c1", "t2"]["text"] == ("Long " * 1200).strip() + "\n\n" + ("answer " * 500).strip()
    )
    assert records[-1]["conversation_id"] == "gone"
    actions = [r["action"] for r in records if r["kind"] == "audit_event"]
    assert actions == [
        "AUDIT_ACTION_CONVERSATION_DELETED",
        "AUDIT_ACTION_SETTINGS_UPDATED",
        "AUDIT_ACTION_SETTINGS_UPDATED",
        "AUDIT_ACTION_BLOCK_REWRITTEN",
    ]
    assert all("Forget" not in json.dumps(r) for r in records)


def test_pages_of_any_size_give_the_same_export(api: Api) -> None:
    ana = api.who("ana")
    fill(api, ana)
    whole = api.search.ExportPrincipalData(
        pb.ExportPrincipalDataRequest(page_size=1000), metadata=ana
    )
    assert whole.next_page_token == ""
    paged: list[pb.ExportRecord] = []
    token, pages = "", 0
    while True:
        page = api.search.ExportPrincipalData(
            pb.ExportPrincipalDataRequest(page_size=1, page_token=token), metadata=ana
        )
        assert len(page.records) <= 1
        paged += page.records
        pages += 1
        token = page.next_page_token
        if not token:
            break
    assert paged == list(whole.records)
    assert pages >= len(whole.records)


def test_round_trip_into_a_fresh_server_and_idempotent_import(
    api: Api, request: pytest.FixtureRequest, tmp_path: Path
) -> None:
    ana = api.who("ana")
    fill(api, ana)
    source = export(api, ana)
    with serving(server_settings("sqlite", request, tmp_path / "target")) as target:
        # Mapped: another tenant and principal in the new deployment.
        mapped = target.who("ana-new", tenant=target.tenant + "-new")
        records = parse_lines(export_lines(api.channel, tuple(ana)))
        done = import_records(target.channel, tuple(mapped), records)
        assert (done["turn"], done["deleted_conversation"], done["memory_block"]) == (2, 1, 1)
        assert done["audit_event skipped"] == 4
        first = export(target, mapped)
        assert comparable(first) == comparable(source)
        hits = target.search.SearchConversations(
            pb.SearchConversationsRequest(query="acct-4821"), metadata=mapped
        ).hits
        assert [h.turn_id for h in hits][:1] == ["t1"]
        # The second import changes nothing: same records, same etags, no new audit event.
        again = import_records(target.channel, tuple(mapped), records)
        assert again["memory_block unchanged"] == 1
        assert export(target, mapped) == first
        events = target.audit.ListAuditEvents(
            audit_pb.ListAuditEventsRequest(), metadata=mapped
        ).events
        assert [e.writer for e in events if e.action == audit_pb.AUDIT_ACTION_BLOCK_REWRITTEN] == [
            block_pb.WRITER_USER
        ]


def test_the_commands_write_and_load_json_lines_and_say_what_they_did(
    api: Api, request: pytest.FixtureRequest, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    fill(api, api.who("ana"))
    out = tmp_path / "ana.jsonl"
    server = f"127.0.0.1:{api.running.port}"
    main(
        ["export", "--server", server, "--tenant", api.tenant, "--principal", "ana", "-o", str(out)]
    )
    lines = out.read_text("utf-8").splitlines()
    assert json.loads(lines[0]) == {
        "kind": "header",
        "format": "memoria-export/1",
        "turn_retention_days": 0,  # the default: turns are kept until deleted
    }
    assert all("kind" in json.loads(line) for line in lines)
    said = capsys.readouterr()
    assert said.out == ""
    assert said.err == (
        "memoria export: wrote 1 memory block, 1 settings, 4 audit events, 2 turns, "
        f"1 deleted conversation to {out}\n"
    )
    # To stdout: the JSON Lines alone there (the old --addr still names the server).
    main(["export", "--addr", server, "--tenant", api.tenant, "--principal", "ana", "-o", "-"])
    said = capsys.readouterr()
    assert said.out.splitlines() == lines
    assert said.err.startswith("memoria export: wrote 1 memory block, ") and "to stdout" in said.err
    with serving(server_settings("sqlite", request, tmp_path / "target")) as target:
        taddr = f"127.0.0.1:{target.running.port}"
        who = ["--server", taddr, "--tenant", target.tenant, "--principal", "ana"]
        main(["import", str(out), *who])
        assert capsys.readouterr().err == (
            "memoria import: loaded 1 memory block, 1 settings, 2 turns, 1 deleted conversation "
            f"from {out}; left out 4 audit events: the source's history\n"
        )
        block = target.blocks.GetMemoryBlock(
            block_service_pb.GetMemoryBlockRequest(), metadata=target.who("ana")
        ).memory_block
        assert block.text == "Preferred name: Ana\nUses Jira account ana-42"
        main(["import", str(out), *who])  # again: nothing changes
        assert "(the memory block was unchanged)" in capsys.readouterr().err
        bad = tmp_path / "bad.jsonl"
        bad.write_text('{"kind": "turn"}\n', "utf-8")
        with pytest.raises(SystemExit, match="not a memoria-export/1 header"):
            main(["import", str(bad), "--server", taddr, "--tenant", target.tenant])
        with pytest.raises(SystemExit, match=r"^memoria import: .*No such file"):
            main(["import", str(tmp_path / "missing.jsonl"), *who])


def test_an_erased_principal_exports_nothing(api: Api) -> None:
    ana = api.who("ana")
    fill(api, ana)
    api.search.ErasePrincipalData(pb.ErasePrincipalDataRequest(), metadata=ana)
    assert export(api, ana) == []
    # Starting again, only what came after the erasure is held.
    index(api, ana, "c9", "t1", "New start?", "Yes.")
    assert [r["kind"] for r in export(api, ana)] == ["turn"]


def test_export_is_isolated_and_needs_an_identity(api: Api) -> None:
    ana, bob = api.who("ana"), api.who("bob")
    fill(api, ana)
    assert export(api, bob) == []
    assert export(api, api.who("ana", tenant=api.tenant + "-other")) == []
    admin = api.who("root", roles="memoria-admin")
    assert export(api, admin) == []  # an administrator exports only its own data
    expect_error(
        lambda: api.search.ExportPrincipalData(pb.ExportPrincipalDataRequest()),
        grpc.StatusCode.UNAUTHENTICATED,
        "ERROR_REASON_UNAUTHENTICATED",
    )
    page = api.search.ExportPrincipalData(pb.ExportPrincipalDataRequest(page_size=1), metadata=ana)
    assert page.next_page_token
    expect_error(
        lambda: api.search.ExportPrincipalData(
            pb.ExportPrincipalDataRequest(page_token=page.next_page_token), metadata=bob
        ),
        grpc.StatusCode.INVALID_ARGUMENT,
        "ERROR_REASON_INVALID_PAGE_TOKEN",
    )
    expect_error(
        lambda: api.search.ExportPrincipalData(
            pb.ExportPrincipalDataRequest(page_size=-1), metadata=ana
        ),
        grpc.StatusCode.INVALID_ARGUMENT,
        "ERROR_REASON_INVALID_ARGUMENT",
    )
