"""`memoria export` and `memoria import`: a person's data as JSON Lines, through the API.

Both are clients of a running server, never readers of its stores: the export is the person's
right of access, so it goes through ExportPrincipalData with the same authentication, scoping
and rules as every call (an export reads only the caller's data, an erased principal's is
empty), and the import replays the records through the ordinary RPCs, so it obeys every rule
the target deployment enforces (limits, credential refusal, deleted conversations).

File format: one JSON object per line, each with a `kind`. The first line is the header
(`{"kind": "header", "format": "memoria-export/1", "turn_retention_days": 0}`: the tenant's
turn retention when it was written, 0 when turns are kept until deleted; turns older than it
are not in the file); then `settings`, `memory_block`,
`audit_event`, `turn` and `deleted_conversation` records, each the contract message's proto3
JSON (field names as in the .proto) plus `kind`.

Import (into the identity it authenticates as: the same tenant and principal, or another one,
which is how a file is mapped to a new deployment's ids) is idempotent, so a second run
changes nothing:
- turns: IndexTurn with the same conversation and turn ids (re-sending a turn replaces it with
  the same text), `text` as the question, waiting until each is searchable;
- deleted conversations: DeleteConversation (deleting again is a no-op), after the turns;
- the block: RewriteMemoryBlock with writer USER (an identical rewrite is a no-op);
- settings: UpdateMemorySettings with writer USER, last (with memory off, turns would be
  skipped);
- audit events are not imported: re-emitting them would falsify the target's history (they
  would claim changes that deployment never saw). The import's own writes are audited there
  as what they are, the person's writes.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import Counter
from collections.abc import Iterable, Iterator
from typing import IO, Any

import grpc
from google.protobuf import json_format
from google.protobuf.message import Message

from memoria.v1 import conversation_search_service_pb2 as search_pb
from memoria.v1 import conversation_search_service_pb2_grpc as search_grpc
from memoria.v1 import memory_block_pb2 as block_pb
from memoria.v1 import memory_block_service_pb2 as blocks_pb
from memoria.v1 import memory_block_service_pb2_grpc as blocks_grpc
from memoria_client import connection
from memoria_client.connection import Metadata

FORMAT = "memoria-export/1"
PAGE_SIZE = 500
_KINDS = ("settings", "memory_block", "audit_event", "turn", "deleted_conversation")


def add_arguments(parser: argparse.ArgumentParser, *, importing: bool) -> None:
    """The command's file argument, then the connection and identity flags every client
    command shares (memoria_client/connection.py)."""
    if importing:
        parser.add_argument("file", help="a JSON Lines file written by `memoria export` (- stdin)")
    else:
        parser.add_argument("-o", "--output", default="-", help="file to write (default stdout)")
    connection.add_arguments(parser)


def export_lines(
    channel: grpc.Channel, md: Metadata, counts: Counter[str] | None = None
) -> Iterator[str]:
    """The caller's export as JSON Lines (header first), page by page; each record's kind is
    counted in `counts` when given."""
    stub = search_grpc.ConversationSearchServiceStub(channel)
    token = ""
    first = True
    while True:
        page = stub.ExportPrincipalData(
            search_pb.ExportPrincipalDataRequest(page_size=PAGE_SIZE, page_token=token),
            metadata=md,
        )
        if first:  # the header says which turn retention applied (every page says the same)
            yield json.dumps(
                {
                    "kind": "header",
                    "format": FORMAT,
                    "turn_retention_days": page.turn_retention_days,
                }
            )
            first = False
        for record in page.records:
            if counts is not None:
                counts[record.WhichOneof("record") or ""] += 1
            yield record_line(record)
        token = page.next_page_token
        if not token:
            return


def record_line(record: search_pb.ExportRecord) -> str:
    """One record as a JSON object with its `kind`."""
    kind = record.WhichOneof("record")
    assert kind is not None
    body = json_format.MessageToDict(getattr(record, kind), preserving_proto_field_name=True)
    return json.dumps({"kind": kind, **body}, ensure_ascii=False, sort_keys=True)


def parse_lines(lines: Iterable[str]) -> list[tuple[str, dict[str, Any]]]:
    """The records of an export file; ValueError for anything that is not one."""
    records: list[tuple[str, dict[str, Any]]] = []
    header = False
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            data = json.loads(line)
        except json.JSONDecodeError as error:
            raise ValueError(f"line {number}: not JSON ({error.msg})") from None
        if not isinstance(data, dict) or not isinstance(data.get("kind"), str):
            raise ValueError(f"line {number}: not a record with a kind")
        kind = data.pop("kind")
        if not header:  # the first record must say what the file is
            if kind != "header" or data.get("format") != FORMAT:
                raise ValueError(f"line {number}: not a {FORMAT} header")
            header = True
            continue
        if kind not in _KINDS:
            raise ValueError(f"line {number}: unknown kind {kind!r}")
        records.append((kind, data))
    return records


def _message(kind: str, data: dict[str, Any]) -> Message:
    types: dict[str, type[Message]] = {
        "settings": block_pb.MemorySettings,
        "memory_block": block_pb.MemoryBlock,
        "turn": search_pb.ExportedTurn,
        "deleted_conversation": search_pb.DeletedConversation,
    }
    return json_format.ParseDict(data, types[kind]())


def import_records(
    channel: grpc.Channel, md: Metadata, records: list[tuple[str, dict[str, Any]]]
) -> Counter[str]:
    """Apply the records in the order the module describes; count what was done by kind."""
    search = search_grpc.ConversationSearchServiceStub(channel)
    blocks = blocks_grpc.MemoryBlockServiceStub(channel)
    done: Counter[str] = Counter()
    by_kind: dict[str, list[dict[str, Any]]] = {k: [] for k in _KINDS}
    for kind, data in records:
        by_kind[kind].append(data)
    for data in by_kind["turn"]:
        turn = _message("turn", data)
        assert isinstance(turn, search_pb.ExportedTurn)
        search.IndexTurn(
            search_pb.IndexTurnRequest(
                conversation_id=turn.conversation_id,
                turn_id=turn.turn_id,
                question=turn.text,
                turn_time=turn.turn_time,
                wait=True,
            ),
            metadata=md,
        )
        done["turn"] += 1
    for data in by_kind["deleted_conversation"]:
        gone = _message("deleted_conversation", data)
        assert isinstance(gone, search_pb.DeletedConversation)
        search.DeleteConversation(
            search_pb.DeleteConversationRequest(conversation_id=gone.conversation_id),
            metadata=md,
        )
        done["deleted_conversation"] += 1
    for data in by_kind["memory_block"]:
        block = _message("memory_block", data)
        assert isinstance(block, block_pb.MemoryBlock)
        response = blocks.RewriteMemoryBlock(
            blocks_pb.RewriteMemoryBlockRequest(text=block.text, writer=block_pb.WRITER_USER),
            metadata=md,
        )
        done["memory_block" if response.changed else "memory_block unchanged"] += 1
    for data in by_kind["settings"]:
        settings = _message("settings", data)
        assert isinstance(settings, block_pb.MemorySettings)
        blocks.UpdateMemorySettings(
            blocks_pb.UpdateMemorySettingsRequest(
                memory_enabled=settings.memory_enabled, writer=block_pb.WRITER_USER
            ),
            metadata=md,
        )
        done["settings"] += 1
    done["audit_event skipped"] = len(by_kind["audit_event"])
    return done


_WORDS = {
    "memory_block": ("memory block", "memory blocks"),
    "settings": ("settings", "settings"),
    "audit_event": ("audit event", "audit events"),
    "turn": ("turn", "turns"),
    "deleted_conversation": ("deleted conversation", "deleted conversations"),
}
"""Each kind of record in the commands' summaries, one and many."""


def _counted(count: int, kind: str) -> str:
    one, many = _WORDS[kind]
    return f"{count} {one if count == 1 else many}"


def summary(counts: Counter[str], kinds: Iterable[str] = _WORDS) -> str:
    """Records by kind, in words: "1 memory block, 1 settings, 12 audit events, ..."."""
    return ", ".join(_counted(counts[kind], kind) for kind in kinds)


def run_export(args: argparse.Namespace) -> None:
    """`memoria export`: write the caller's data to a file or stdout, then say on stderr what
    was written (stderr always: with `-o -` stdout carries the JSON Lines and nothing else)."""
    counts: Counter[str] = Counter()
    with connection.channel(args) as channel:
        lines = export_lines(channel, connection.metadata(args), counts)
        if args.output == "-":
            _write(lines, sys.stdout)
            sys.stdout.flush()
        else:
            with open(args.output, "w", encoding="utf-8") as out:
                _write(lines, out)
    where = "stdout" if args.output == "-" else args.output
    print(f"memoria export: wrote {summary(counts)} to {where}", file=sys.stderr)


def _write(lines: Iterator[str], out: IO[str]) -> None:
    for line in lines:
        out.write(line + "\n")


def run_import(args: argparse.Namespace) -> None:
    """`memoria import FILE`: load an export into the deployment at --server, then say on
    stderr what was loaded and what was left out (the audit events: see the module)."""
    if args.file == "-":
        records = parse_lines(sys.stdin)
    else:
        with open(args.file, encoding="utf-8") as source:
            records = parse_lines(source)
    with connection.channel(args) as channel:
        done = import_records(channel, connection.metadata(args), records)
    loaded = done.copy()
    loaded["memory_block"] += done["memory_block unchanged"]
    kinds = ("memory_block", "settings", "turn", "deleted_conversation")
    message = f"memoria import: loaded {summary(loaded, kinds)}"
    message += " from stdin" if args.file == "-" else f" from {args.file}"
    if done["memory_block unchanged"]:
        message += " (the memory block was unchanged)"
    if skipped := done["audit_event skipped"]:
        message += f"; left out {_counted(skipped, 'audit_event')}: the source's history"
    print(message, file=sys.stderr)


def main(args: argparse.Namespace) -> None:
    """Run the command; an RPC error becomes a one-line message with its reason."""
    try:
        run_import(args) if args.command == "import" else run_export(args)
    except (ValueError, OSError) as error:  # not an export file; a file that cannot be used
        sys.exit(f"memoria {args.command}: {error}")
    except grpc.RpcError as error:
        code = error.code().name if isinstance(error, grpc.Call) else "UNKNOWN"
        details = error.details() if isinstance(error, grpc.Call) else ""
        sys.exit(f"memoria {args.command}: the server answered {code}: {details}")
