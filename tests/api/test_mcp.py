"""`memoria mcp` (issue 11, item 5) driven by the MCP SDK's own client against a real server.

A real Memoria server runs in this process on 127.0.0.1:0 (SQLite: the MCP server is a client
of the gRPC API, so the storage kind changes nothing it does). `memoria mcp` runs as the
installed command, as an MCP host would start it: over stdio (spawned by the SDK's
`stdio_client`, identity from its flags) and over streamable HTTP (a subprocess on
127.0.0.1:0 in front of a Memoria in jwt mode, each request's bearer token checked by Memoria).
Every process started here is stopped by its fixture or by the SDK's client on exit.
"""

from __future__ import annotations

import json
import subprocess
import time
import uuid
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, cast

import anyio
import httpx2
import jwt
import pytest
from google.protobuf.timestamp_pb2 import Timestamp
from mcp import ClientSession, StdioServerParameters, stdio_client
from mcp.client.streamable_http import streamable_http_client
from mcp.shared.exceptions import MCPError
from mcp_types import RequestParamsMeta

from memoria.v1 import conversation_search_service_pb2 as search_pb
from memoria.v1 import memory_block_pb2 as block_pb
from memoria.v1 import memory_block_service_pb2 as blocks_pb
from memoria_client import MemoriaTurnAdapter
from memoria_client.mcp_server import (
    CONVERSATION_META,
    PROMPT_SECTION_URI,
    TURN_META,
    _StdioTurns,
)
from memoria_client.tool_files import load_source
from tests.api.conftest import Api, Metadata, server_settings, serving
from tests.processes import MEMORIA, clean_env, wait_for_port

ROOT = Path(__file__).resolve().parents[2]
SECRET = "mcp-test-hs256-secret-0123456789abcdef"
AUDIENCE = "memoria"
START_TIMEOUT_S = 30.0
CALL_TIMEOUT_S = 60.0


def _run(main: Callable[[], Awaitable[None]]) -> None:
    """Run an async test body, bounded so a stuck transport fails the test instead of hanging."""

    async def bounded() -> None:
        with anyio.fail_after(CALL_TIMEOUT_S):
            await main()

    anyio.run(bounded)


def _text(result: Any) -> str:
    [content] = result.content
    assert content.type == "text"
    return str(content.text)


def _index(api: Api, metadata: Metadata, conversation: str, token: str) -> None:
    """A finished turn that mentions `token`, searchable when this returns (wait)."""
    when = Timestamp()
    when.FromDatetime(datetime(2026, 11, 2, 10, 0, tzinfo=UTC))
    response = api.search.IndexTurn(
        search_pb.IndexTurnRequest(
            conversation_id=conversation,
            turn_id="1",
            question="Which account did the refund go to?",
            answer=f"To {token}, on 2026-11-02.",
            turn_time=when,
            wait=True,
        ),
        metadata=metadata,
    )
    assert response.outcome == search_pb.INDEX_TURN_OUTCOME_INDEXED


async def _exercise(session: ClientSession, api: Api, metadata: Metadata) -> None:
    """What every transport must do, checked against the gRPC API and the adapter."""
    await session.initialize()

    listed = await session.list_tools()
    source = {t["name"]: t for t in load_source()}
    assert {t.name for t in listed.tools} == set(source)
    for tool in listed.tools:
        assert tool.description == source[tool.name]["description"]
        assert tool.input_schema == source[tool.name]["parameters"]

    token = f"acct-{uuid.uuid4().hex[:6]}"
    block = f"Preferred name: Ana\nUses billing account {token}"
    saved = await session.call_tool("memory_rewrite", {"text": block})
    assert saved.is_error is False
    text = _text(saved)
    assert text.startswith("Saved.")
    assert f"+ Uses billing account {token}" in text
    stored = api.blocks.GetMemoryBlock(blocks_pb.GetMemoryBlockRequest(), metadata=metadata)
    assert stored.memory_block.text == block

    resources = await session.list_resources()
    assert [str(r.uri) for r in resources.resources] == [PROMPT_SECTION_URI]
    read = await session.read_resource(PROMPT_SECTION_URI)
    [contents] = read.contents
    adapter = MemoriaTurnAdapter(api.channel, metadata)
    adapter.start_turn("c-check", "1")
    expected = adapter.prompt_section()
    assert getattr(contents, "text", None) == expected
    assert expected.endswith(f"characters)\n{block}")  # the block comes last

    conversation = f"c-{uuid.uuid4().hex[:8]}"
    _index(api, metadata, conversation, token)
    found = await session.call_tool("conversation_search", {"query": token, "max_turns": 3})
    assert found.is_error is False
    assert conversation in _text(found) and token in _text(found)

    bad = await session.call_tool("conversation_search", {"max_turns": 3})
    assert bad.is_error is True
    assert "query" in _text(bad)


# ---- stdio ----


@pytest.fixture
def trusted(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Api]:
    """A Memoria server in trusted-headers mode (loopback), on SQLite."""
    with serving(server_settings("sqlite", request, tmp_path)) as api:
        yield api


def _stdio(api: Api, principal: str, *, earlier_names: bool = False) -> StdioServerParameters:
    """`memoria mcp` as an MCP host starts it: the server and the identity as flags, or, as a
    host configured for an earlier release does, in the environment under the earlier names
    (MEMORIA_MCP_TARGET, MEMORIA_MCP_TENANT, MEMORIA_MCP_PRINCIPAL), which keep working."""
    server = f"127.0.0.1:{api.running.port}"
    if earlier_names:
        args = ["mcp"]
        env = clean_env(
            MEMORIA_MCP_TARGET=server,
            MEMORIA_MCP_TENANT=api.tenant,
            MEMORIA_MCP_PRINCIPAL=principal,
        )
    else:
        args = ["mcp", "--server", server, "--tenant", api.tenant, "--principal", principal]
        env = clean_env()
    return StdioServerParameters(command=str(MEMORIA), args=args, env=env, cwd=str(ROOT))


def test_stdio_serves_the_tools_and_the_prompt_section(trusted: Api) -> None:
    async def main() -> None:
        async with (
            stdio_client(_stdio(trusted, "ana")) as (read, write),
            ClientSession(read, write) as session,
        ):
            await _exercise(session, trusted, trusted.who("ana"))

    _run(main)


def test_stdio_refuses_a_fourth_failed_write_in_a_turn_without_calling(trusted: Api) -> None:
    async def main() -> None:
        async with (
            stdio_client(_stdio(trusted, "bo", earlier_names=True)) as (read, write),
            ClientSession(read, write) as session,
        ):
            await session.initialize()
            too_long = "x" * 4001
            for attempt in range(1, 4):
                result = await session.call_tool("memory_rewrite", {"text": too_long})
                assert result.is_error is True
                assert f"{attempt} of 3" in _text(result)
            refused = await session.call_tool("memory_rewrite", {"text": "Preferred name: Bo"})
            assert refused.is_error is True
            # Refused without a call: the valid block was not saved.
            stored = trusted.blocks.GetMemoryBlock(
                blocks_pb.GetMemoryBlockRequest(), metadata=trusted.who("bo")
            )
            assert stored.memory_block.text == ""
            # Reading the prompt section starts the next turn: the write goes through.
            await session.read_resource(PROMPT_SECTION_URI)
            saved = await session.call_tool("memory_rewrite", {"text": "Preferred name: Bo"})
            assert saved.is_error is False, _text(saved)

    _run(main)


def test_stdio_calls_count_in_the_turn_named_in_meta(trusted: Api) -> None:
    """A backend that names its turns (as at the server's own /mcp) finds each turn's render
    and writes under those ids, and can finish the turn with them."""
    turn = cast(RequestParamsMeta, {CONVERSATION_META: "c-named", TURN_META: "4"})

    async def main() -> None:
        async with (
            stdio_client(_stdio(trusted, "cy")) as (read, write),
            ClientSession(read, write) as session,
        ):
            await session.initialize()
            await session.read_resource(PROMPT_SECTION_URI, meta=turn)
            saved = await session.call_tool("memory_rewrite", {"text": "Name: Cy"}, meta=turn)
            assert saved.is_error is False, _text(saved)
            half = cast(RequestParamsMeta, {CONVERSATION_META: "c-named"})
            with pytest.raises(MCPError) as caught:
                await session.call_tool("memory_rewrite", {"text": "Name: Cy2"}, meta=half)
            assert TURN_META in caught.value.message

    _run(main)
    inspection = trusted.search.GetTurnInspection(
        search_pb.GetTurnInspectionRequest(
            turn=block_pb.TurnReference(conversation_id="c-named", turn_id="4")
        ),
        metadata=tuple(trusted.who("cy")),
    ).inspection
    assert len(inspection.renders) == 1
    assert [list(w.added_lines) for w in inspection.writes] == [["Name: Cy"]]


def test_stdio_without_an_identity_exits_with_one_line(tmp_path: Path) -> None:
    done = subprocess.run(
        [str(MEMORIA), "mcp", "--server", "127.0.0.1:1", "--tenant", "acme"],
        cwd=tmp_path,
        env=clean_env(),
        capture_output=True,
        text=True,
        stdin=subprocess.DEVNULL,
        timeout=60,
    )
    assert done.returncode == 1
    assert "Traceback" not in done.stderr
    assert done.stderr.strip().splitlines()[-1].startswith("memoria mcp: say who the tools act")


class _Adapter:
    """Counts the turns started, in place of a MemoriaTurnAdapter."""

    def __init__(self) -> None:
        self.started: list[tuple[str, str]] = []

    @property
    def turns(self) -> int:
        return len(self.started)

    def start_turn(self, conversation_id: str, turn_id: str) -> None:
        self.started.append((conversation_id, turn_id))


def test_stdio_turns_start_after_a_quiet_gap_or_a_read_of_the_section() -> None:
    now = [100.0]
    adapter = _Adapter()
    turns = _StdioTurns(adapter, gap=60.0, clock=lambda: now[0])  # type: ignore[arg-type]
    turns.before_call()
    assert adapter.turns == 1
    now[0] += 59.0
    turns.before_call()
    assert adapter.turns == 1  # the model's next call in the same turn
    now[0] += 61.0
    turns.before_call()
    assert adapter.turns == 2  # after a quiet minute: the person's next message
    turns.new_turn()
    assert adapter.turns == 3
    # One conversation for the session, its turns numbered: each call names its turn.
    (conversation,) = {c for c, _ in adapter.started}
    assert conversation.startswith("mcp-")
    assert [t for _, t in adapter.started] == ["1", "2", "3"]


# ---- streamable HTTP, bearer tokens checked by Memoria ----


def _token(tenant: str, principal: str, secret: str = SECRET) -> str:
    claims = {"tenant": tenant, "sub": principal, "aud": AUDIENCE, "exp": int(time.time()) + 300}
    return jwt.encode(claims, secret, algorithm="HS256")


@dataclass
class McpHttp:
    """`memoria mcp --transport http` in front of a Memoria in jwt mode."""

    url: str
    api: Api


@pytest.fixture
def mcp_http(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[McpHttp]:
    settings = server_settings(
        "sqlite", request, tmp_path, auth="jwt", jwt_hs256_secret=SECRET, jwt_audience=AUDIENCE
    )
    with serving(settings) as api:
        port_file = tmp_path / "mcp.port"
        log = tmp_path / "mcp.log"
        with log.open("wb") as out:
            process = subprocess.Popen(
                [
                    str(MEMORIA),
                    "mcp",
                    "--transport",
                    "http",
                    "--listen",
                    "127.0.0.1:0",
                    "--port-file",
                    str(port_file),
                    "--server",
                    f"127.0.0.1:{api.running.port}",
                ],
                cwd=tmp_path,
                env=clean_env(),
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
            )
        try:
            port = wait_for_port(process, port_file, log, timeout=START_TIMEOUT_S)
            yield McpHttp(f"http://127.0.0.1:{port}/mcp", api)
        finally:
            process.terminate()
            try:
                process.wait(timeout=20)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait(timeout=10)


def test_http_with_a_valid_token_serves_the_tools(mcp_http: McpHttp) -> None:
    tenant = mcp_http.api.tenant
    bearer = f"Bearer {_token(tenant, 'ana')}"

    async def main() -> None:
        async with (
            httpx2.AsyncClient(headers={"Authorization": bearer}, timeout=30) as http,
            streamable_http_client(mcp_http.url, http_client=http) as (read, write),
            ClientSession(read, write) as session,
        ):
            await _exercise(session, mcp_http.api, (("authorization", bearer),))

    _run(main)


def _initialize(headers: dict[str, str]) -> httpx2.Response:
    """One MCP initialize request, as the first POST of any client."""
    message = {
        "jsonrpc": "2.0",
        "id": 1,
        "method": "initialize",
        "params": {
            "protocolVersion": "2025-06-18",
            "capabilities": {},
            "clientInfo": {"name": "test", "version": "0"},
        },
    }
    return httpx2.post(
        headers["url"],
        content=json.dumps(message),
        headers={
            "Content-Type": "application/json",
            "Accept": "application/json, text/event-stream",
            **{k: v for k, v in headers.items() if k != "url"},
        },
        timeout=30,
    )


@pytest.mark.parametrize(
    "authorization",
    [None, "Bearer forged", "forged-secret", "Basic YWxpY2U6c2VjcmV0"],
    ids=["missing", "not-a-jwt", "wrong-signature", "not-bearer"],
)
def test_http_without_a_token_memoria_accepts_is_refused(
    mcp_http: McpHttp, authorization: str | None
) -> None:
    tenant = mcp_http.api.tenant
    if authorization == "forged-secret":
        # Well formed and naming a real tenant and person, but not signed with Memoria's key.
        authorization = (
            f"Bearer {_token(tenant, 'ana', secret='another-hs256-secret-0123456789abcdef')}"
        )
    headers = {"url": mcp_http.url}
    if authorization is not None:
        headers["Authorization"] = authorization
    response = _initialize(headers)
    assert response.status_code == 401
    assert response.headers["www-authenticate"].startswith("Bearer")
    # Nothing was written for the person the forged token names.
    valid = (("authorization", f"Bearer {_token(tenant, 'ana')}"),)
    stored = mcp_http.api.blocks.GetMemoryBlock(blocks_pb.GetMemoryBlockRequest(), metadata=valid)
    assert stored.memory_block.text == ""


def test_http_passes_the_token_through_so_each_caller_acts_as_itself(mcp_http: McpHttp) -> None:
    tenant = mcp_http.api.tenant

    async def write(principal: str, text: str) -> None:
        bearer = f"Bearer {_token(tenant, principal)}"
        async with (
            httpx2.AsyncClient(headers={"Authorization": bearer}, timeout=30) as http,
            streamable_http_client(mcp_http.url, http_client=http) as (read, write_stream),
            ClientSession(read, write_stream) as session,
        ):
            await session.initialize()
            result = await session.call_tool("memory_rewrite", {"text": text})
            assert result.is_error is False, _text(result)

    async def main() -> None:
        await write("ana", "Preferred name: Ana")
        await write("bo", "Preferred name: Bo")

    _run(main)
    for principal, text in (("ana", "Preferred name: Ana"), ("bo", "Preferred name: Bo")):
        metadata = (("authorization", f"Bearer {_token(tenant, principal)}"),)
        stored = mcp_http.api.blocks.GetMemoryBlock(
            blocks_pb.GetMemoryBlockRequest(), metadata=metadata
        )
        assert stored.memory_block.text == text
