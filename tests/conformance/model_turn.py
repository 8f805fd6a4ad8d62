"""Runs the scripted model turn of tests/conformance/model_turn.json against a real server.

The conversation is data, stored once: each step is one call (the model's tool calls in, the
exact text it must read out), so the Python, Go, TypeScript and MCP runners check the same
outcomes against the same file. This runner calls the raw generated stubs (no adapter), so it
checks the server's ModelToolService itself; an adapter's runner plays the same steps through
its own API.

    .venv/bin/python -m tests.conformance.model_turn --server 127.0.0.1:50051

runs it against a server in trusted-headers mode (`make serve`), as a fresh principal of a
fresh tenant; tests/conformance/test_model_turn.py runs it in the suite.

Step kinds (`call`), and what a runner does for each:
- GetModelTools: the tools must equal `tools_file`'s definitions (name, description, the
  parsed schema) and the instructions `instructions_file`'s text, stripped.
- RenderPromptSection (`turn`): `prompt_section` must be the instructions, a blank line, then
  `expect.after_instructions`; `char_count` must equal `expect.char_count`.
- ExecuteToolCall (`turn`, `tool_name`, and `arguments_json` sent verbatim, or `arguments`
  sent as compact JSON): the response's `text`, `is_error`, `outcome` (value name),
  `failed_write_count` must equal `expect`'s. With `"identity": "none"` the call carries no
  identity: it must fail with `expect.code` and ErrorInfo `expect.reason`, and a
  LocalizedMessage whose message is `expect.localized_message`. With `"omit_turn": true` it
  sends no turn and must fail with `expect.code`, `expect.reason` and `expect.violations`.
- IndexTurn (`conversation_id`, `turn_id`, `question`, `answer`, `turn_time` RFC 3339): sent
  with `wait` set, so the turn is searchable when it returns; must be INDEXED.
- UpdateMemorySettings (`memory_enabled`): as the person (WRITER_USER).
- GetTurnInspection (`turn`): `writes` (each `removed_lines` and `added_lines`, oldest first),
  `failed_write_count`, and the number of `renders` and `searches` must equal `expect`'s.
"""

from __future__ import annotations

import argparse
import json
import sys
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

import grpc
from google.protobuf import timestamp_pb2
from google.rpc import error_details_pb2
from grpc_status import rpc_status

from memoria.v1 import conversation_search_service_pb2 as search_pb
from memoria.v1 import conversation_search_service_pb2_grpc as search_grpc
from memoria.v1 import memory_block_pb2 as block_pb
from memoria.v1 import memory_block_service_pb2 as blocks_pb
from memoria.v1 import memory_block_service_pb2_grpc as blocks_grpc
from memoria.v1 import model_tool_service_pb2 as tools_pb
from memoria.v1 import model_tool_service_pb2_grpc as tools_grpc

ROOT = Path(__file__).resolve().parents[2]
DATA = Path(__file__).resolve().parent / "model_turn.json"
TIMEOUT_S = 60.0


@dataclass
class Mismatch:
    """One step whose answer differs from the data."""

    step: str
    what: str
    expected: object
    actual: object

    def __str__(self) -> str:
        return f"{self.step}: {self.what}: expected {self.expected!r}, got {self.actual!r}"


class Runner:
    """Plays the steps on one channel as one principal; collects every mismatch."""

    def __init__(self, channel: grpc.Channel, identity: Sequence[tuple[str, str]]) -> None:
        self._tools = tools_grpc.ModelToolServiceStub(channel)
        self._blocks = blocks_grpc.MemoryBlockServiceStub(channel)
        self._search = search_grpc.ConversationSearchServiceStub(channel)
        self._identity = tuple(identity)
        self.mismatches: list[Mismatch] = []
        self._instructions = ""

    def run(self, data: dict[str, Any]) -> list[Mismatch]:
        """Every step in order; the mismatches found (empty when the server conforms)."""
        self._instructions = (ROOT / data["instructions_file"]).read_text("utf-8").strip()
        for step in data["steps"]:
            getattr(self, f"_{step['call']}")(step, data)
        return self.mismatches

    def _check(self, step: dict[str, Any], what: str, expected: object, actual: object) -> None:
        if expected != actual:
            self.mismatches.append(Mismatch(step["name"], what, expected, actual))

    def _GetModelTools(self, step: dict[str, Any], data: dict[str, Any]) -> None:
        response = self._tools.GetModelTools(
            tools_pb.GetModelToolsRequest(), metadata=self._identity, timeout=TIMEOUT_S
        )
        source = json.loads((ROOT / data["tools_file"]).read_text("utf-8"))["tools"]
        served = [
            {
                "name": t.name,
                "description": t.description,
                "parameters": json.loads(t.parameters_json_schema),
            }
            for t in response.tools
        ]
        self._check(step, "tools", source, served)
        self._check(step, "base_instructions", self._instructions, response.base_instructions)

    def _RenderPromptSection(self, step: dict[str, Any], data: dict[str, Any]) -> None:
        expect = step["expect"]
        response = self._tools.RenderPromptSection(
            tools_pb.RenderPromptSectionRequest(turn=_turn(step["turn"])),
            metadata=self._identity,
            timeout=TIMEOUT_S,
        )
        section = f"{self._instructions}\n\n{expect['after_instructions']}"
        self._check(step, "prompt_section", section, response.prompt_section)
        self._check(step, "char_count", expect["char_count"], response.char_count)
        self._check(step, "section_char_count", len(section), response.section_char_count)

    def _ExecuteToolCall(self, step: dict[str, Any], data: dict[str, Any]) -> None:
        expect = step["expect"]
        if "arguments_json" in step:
            arguments = step["arguments_json"]
        else:
            arguments = json.dumps(step["arguments"], separators=(",", ":"), ensure_ascii=False)
        request = tools_pb.ExecuteToolCallRequest(
            tool_name=step["tool_name"], arguments_json=arguments
        )
        if not step.get("omit_turn"):
            request.turn.CopyFrom(_turn(step["turn"]))
        identity = () if step.get("identity") == "none" else self._identity
        try:
            response = self._tools.ExecuteToolCall(request, metadata=identity, timeout=TIMEOUT_S)
        except grpc.RpcError as error:
            self._check_error(step, error)
            return
        if "code" in expect:
            self._check(step, "status", expect["code"], "OK")
            return
        self._check(step, "text", expect["text"], response.text)
        self._check(step, "is_error", expect["is_error"], response.is_error)
        outcome = tools_pb.ToolCallOutcome.Name(response.outcome)
        self._check(step, "outcome", expect["outcome"], outcome)
        self._check(
            step, "failed_write_count", expect["failed_write_count"], response.failed_write_count
        )

    def _check_error(self, step: dict[str, Any], error: grpc.RpcError) -> None:
        expect = step["expect"]
        assert isinstance(error, grpc.Call)
        self._check(step, "status", expect.get("code", "OK"), error.code().name)
        reason, localized, violations = "", None, {}
        status = rpc_status.from_call(error)
        for detail in status.details if status is not None else ():
            info = error_details_pb2.ErrorInfo()
            message = error_details_pb2.LocalizedMessage()
            bad = error_details_pb2.BadRequest()
            if detail.Unpack(info):
                reason = info.reason
            elif detail.Unpack(message):
                localized = message.message
            elif detail.Unpack(bad):
                violations = {v.field: v.description for v in bad.field_violations}
        self._check(step, "reason", expect.get("reason"), reason)
        self._check(step, "localized_message", expect.get("localized_message"), localized)
        if "violations" in expect:
            self._check(step, "violations", expect["violations"], violations)

    def _IndexTurn(self, step: dict[str, Any], data: dict[str, Any]) -> None:
        when = timestamp_pb2.Timestamp()
        when.FromDatetime(datetime.fromisoformat(step["turn_time"]))
        response = self._search.IndexTurn(
            search_pb.IndexTurnRequest(
                conversation_id=step["conversation_id"],
                turn_id=step["turn_id"],
                question=step["question"],
                answer=step["answer"],
                turn_time=when,
                wait=True,
            ),
            metadata=self._identity,
            timeout=TIMEOUT_S,
        )
        outcome = search_pb.IndexTurnOutcome.Name(response.outcome)
        self._check(step, "outcome", "INDEX_TURN_OUTCOME_INDEXED", outcome)

    def _UpdateMemorySettings(self, step: dict[str, Any], data: dict[str, Any]) -> None:
        self._blocks.UpdateMemorySettings(
            blocks_pb.UpdateMemorySettingsRequest(
                memory_enabled=step["memory_enabled"], writer=block_pb.WRITER_USER
            ),
            metadata=self._identity,
            timeout=TIMEOUT_S,
        )

    def _GetTurnInspection(self, step: dict[str, Any], data: dict[str, Any]) -> None:
        expect = step["expect"]
        inspection = self._search.GetTurnInspection(
            search_pb.GetTurnInspectionRequest(turn=_turn(step["turn"])),
            metadata=self._identity,
            timeout=TIMEOUT_S,
        ).inspection
        writes = [
            {"removed_lines": list(w.removed_lines), "added_lines": list(w.added_lines)}
            for w in inspection.writes
        ]
        self._check(step, "writes", expect["writes"], writes)
        self._check(
            step, "failed_write_count", expect["failed_write_count"], inspection.failed_write_count
        )
        self._check(step, "renders", expect["renders"], len(inspection.renders))
        self._check(step, "searches", expect["searches"], len(inspection.searches))


def _turn(ids: Sequence[str]) -> block_pb.TurnReference:
    conversation_id, turn_id = ids
    return block_pb.TurnReference(conversation_id=conversation_id, turn_id=turn_id)


def load() -> dict[str, Any]:
    """The scripted conversation."""
    data: dict[str, Any] = json.loads(DATA.read_text("utf-8"))
    return data


def fresh_identity() -> list[tuple[str, str]]:
    """Trusted headers of a principal no earlier run used, so runs never meet."""
    return [
        ("x-memoria-tenant", f"conformance-{uuid.uuid4().hex[:12]}"),
        ("x-memoria-principal", "ana"),
    ]


def main() -> int:
    """Run the conversation against `--server` and report each mismatch."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--server", default="127.0.0.1:50051", help="HOST:PORT")
    args = parser.parse_args()
    with grpc.insecure_channel(args.server) as channel:
        mismatches = Runner(channel, fresh_identity()).run(load())
    for mismatch in mismatches:
        print(mismatch, file=sys.stderr)
    print(f"{len(load()['steps'])} steps, {len(mismatches)} mismatches")
    return 1 if mismatches else 0


if __name__ == "__main__":
    sys.exit(main())
