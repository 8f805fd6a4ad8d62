"""MCP served by Memoria itself at `/mcp` on its HTTP port (server/rpc/mcp.py), driven by the MCP
SDK's own streamable HTTP client against a real server in this process.

In trusted-headers mode (loopback, as `make serve`) and in jwt mode, the identity is the
request's headers exactly as for every other call. The scripted conversation of
tests/conformance/model_turn.json is played over MCP word for word; the steps MCP cannot
express (a finished turn, the person's settings, an inspection, arguments that are not a JSON
object, a call with no turn at all) go through the stubs, as the adapters' runners play them.
"""

from __future__ import annotations

import dataclasses
import json
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from contextlib import asynccontextmanager
from typing import Any, cast

import anyio
import httpx2
import jwt
import pytest
from mcp import ClientSession
from mcp.client.streamable_http import streamable_http_client
from mcp.shared.exceptions import MCPError
from mcp_types import RequestParamsMeta

from memoria.v1 import conversation_search_service_pb2 as search_pb
from memoria.v1 import memory_block_pb2 as block_pb
from memoria.v1 import memory_block_service_pb2 as blocks_pb
from memoria.v1 import model_tool_service_pb2 as tools_pb
from memoria.v1 import model_tool_service_pb2_grpc as tools_grpc
from server.rpc.mcp import CONVERSATION_META, PROMPT_SECTION_URI, TURN_META, UNAUTHENTICATED_CODE
from tests.api.conftest import Api, server_settings, serving
from tests.conformance.model_turn import ROOT, Mismatch, Runner, fresh_identity, load

SECRET = "mcp-http-test-hs256-secret-0123456789abcdef"
AUDIENCE = "memoria"
CALL_TIMEOUT_S = 90.0


def _run(main: Callable[[], Awaitable[None]]) -> None:
    """Run an async test body, bounded so a stuck transport fails the test instead of hanging."""

    async def bounded() -> None:
        with anyio.fail_after(CALL_TIMEOUT_S):
            await main()

    anyio.run(bounded)


def _url(api: Api) -> str:
    assert api.running.web is not None
    return f"http://127.0.0.1:{api.running.web.port}/mcp"


@asynccontextmanager
async def _session(api: Api, headers: dict[str, str]) -> AsyncIterator[ClientSession]:
    """An initialized MCP session whose every request carries `headers`."""
    async with (
        httpx2.AsyncClient(headers=headers, timeout=30) as http,
        streamable_http_client(_url(api), http_client=http) as (read, write),
        ClientSession(read, write) as session,
    ):
        await session.initialize()
        yield session


def _text(result: Any) -> str:
    [content] = result.content
    assert content.type == "text"
    return str(content.text)


def _meta(conversation: str, turn: str) -> RequestParamsMeta:
    """A request's `_meta` naming its turn."""
    return cast(RequestParamsMeta, {CONVERSATION_META: conversation, TURN_META: turn})


@pytest.fixture(scope="module")
def trusted_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Api]:
    """`make serve`'s shape: trusted headers on loopback, the HTTP port beside the gRPC one."""
    settings = server_settings(
        "sqlite",
        None,  # type: ignore[arg-type]
        tmp_path_factory.mktemp("mcp-http"),
        http_listen="127.0.0.1:0",
    )
    with serving(settings) as api:
        yield api


@pytest.fixture
def trusted(trusted_server: Api) -> Api:
    """The module's server, as a tenant of this test's own."""
    return dataclasses.replace(trusted_server, tenant=f"t-{uuid.uuid4().hex[:10]}")


# ---- the conformance data over MCP ----


class McpRunner(Runner):
    """Plays the model's side of each step over MCP, the rest through the stubs."""

    def __init__(self, api: Api, identity: list[tuple[str, str]]) -> None:
        super().__init__(api.channel, identity)
        self._api = api
        self._headers = dict(identity)
        self.over_mcp: list[str] = []  # the names of the steps played over MCP

    async def play(self, data: dict[str, Any]) -> list[Mismatch]:
        """Every step in order; the mismatches found."""
        self._instructions = (ROOT / data["instructions_file"]).read_text("utf-8").strip()
        async with _session(self._api, self._headers) as session:
            for step in data["steps"]:
                kind = step["call"]
                if kind == "GetModelTools":
                    await self._tools_over_mcp(session, step, data)
                elif kind == "RenderPromptSection":
                    await self._section_over_mcp(session, step)
                elif kind == "ExecuteToolCall" and _mcp_can_send(step):
                    await self._tool_call_over_mcp(session, step)
                else:  # not the model's side, or not expressible in MCP: the stubs
                    getattr(self, f"_{kind}")(step, data)
        return self.mismatches

    async def _tools_over_mcp(
        self, session: ClientSession, step: dict[str, Any], data: dict[str, Any]
    ) -> None:
        source = json.loads((ROOT / data["tools_file"]).read_text("utf-8"))["tools"]
        listed = await session.list_tools()
        served = [
            {"name": t.name, "description": t.description, "parameters": t.input_schema}
            for t in listed.tools
        ]
        self._check(step, "tools", source, served)

    async def _section_over_mcp(self, session: ClientSession, step: dict[str, Any]) -> None:
        read = await session.read_resource(PROMPT_SECTION_URI, meta=_meta(*step["turn"]))
        [contents] = read.contents
        section = f"{self._instructions}\n\n{step['expect']['after_instructions']}"
        self._check(step, "prompt_section", section, getattr(contents, "text", None))

    async def _tool_call_over_mcp(self, session: ClientSession, step: dict[str, Any]) -> None:
        expect = step["expect"]
        arguments = _arguments(step)
        assert arguments is not None
        if step.get("identity") == "none":
            # A host whose requests carry no identity: the model reads the server's words.
            async with _session(self._api, {}) as anonymous:
                result = await anonymous.call_tool(
                    step["tool_name"], arguments, meta=_meta(*step["turn"])
                )
            expect = {"text": expect["localized_message"], "is_error": True}
        else:
            result = await session.call_tool(
                step["tool_name"], arguments, meta=_meta(*step["turn"])
            )
        self._check(step, "text", expect["text"], _text(result))
        self._check(step, "is_error", expect["is_error"], result.is_error)
        self.over_mcp.append(step["name"])


def _arguments(step: dict[str, Any]) -> dict[str, Any] | None:
    """The call's arguments as an MCP host sends them (a JSON object), or None when the
    model's text is not one (an MCP host cannot send it: it parses the model's JSON first)."""
    if "arguments" in step:
        arguments: dict[str, Any] = step["arguments"]
        return arguments
    try:
        parsed = json.loads(step["arguments_json"])
    except ValueError:
        return None
    return parsed if isinstance(parsed, dict) else None


def _mcp_can_send(step: dict[str, Any]) -> bool:
    """False for a call with no turn (over MCP a call without one gets a turn of its own) and
    for arguments that are not a JSON object."""
    return not step.get("omit_turn") and _arguments(step) is not None


def test_the_scripted_conversation_reads_word_for_word_over_mcp(trusted: Api) -> None:
    runner = McpRunner(trusted, fresh_identity())
    data = load()
    mismatches: list[Mismatch] = []

    async def main() -> None:
        mismatches.extend(await runner.play(data))

    _run(main)
    assert not mismatches, "\n".join(map(str, mismatches))
    # Of the model's calls only these three are not MCP's to make: they went through the stubs.
    calls = [s for s in data["steps"] if s["call"] == "ExecuteToolCall"]
    assert [s["name"] for s in calls if s["name"] not in runner.over_mcp] == [
        "search: malformed JSON",
        "malformed JSON: not sent, second failed write",
        "the backend's mistake: no turn",
    ]


# ---- what the endpoint serves ----


def test_the_tools_the_section_and_the_instructions_are_the_servers(trusted: Api) -> None:
    who = dict(trusted.who("ana"))
    served = tools_grpc.ModelToolServiceStub(trusted.channel).GetModelTools(
        tools_pb.GetModelToolsRequest(), metadata=tuple(trusted.who("ana"))
    )

    async def main() -> None:
        async with (
            httpx2.AsyncClient(headers=who, timeout=30) as http,
            streamable_http_client(_url(trusted), http_client=http) as (read, write),
            ClientSession(read, write) as session,
        ):
            hello = await session.initialize()
            assert hello.instructions is not None
            assert hello.instructions.startswith(served.base_instructions.strip())
            assert PROMPT_SECTION_URI in hello.instructions
            listed = await session.list_tools()
            assert [(t.name, t.description, t.input_schema) for t in listed.tools] == [
                (t.name, t.description, json.loads(t.parameters_json_schema)) for t in served.tools
            ]
            resources = await session.list_resources()
            assert [str(r.uri) for r in resources.resources] == [PROMPT_SECTION_URI]
            saved = await session.call_tool("memory_rewrite", {"text": "Preferred name: Ana"})
            assert saved.is_error is False, _text(saved)
            read_back = await session.read_resource(PROMPT_SECTION_URI)
            [contents] = read_back.contents
            text = getattr(contents, "text", "")
            assert text.startswith(served.base_instructions)
            assert text.endswith("characters)\nPreferred name: Ana")  # the block comes last

    _run(main)


def test_a_plain_json_post_lists_the_tools_without_a_session(trusted: Api) -> None:
    """Stateless, JSON answers: what the README's curl does."""
    response = httpx2.post(
        _url(trusted),
        json={"jsonrpc": "2.0", "id": 1, "method": "tools/list"},
        headers={"accept": "application/json, text/event-stream", **dict(trusted.who("ana"))},
        timeout=30,
    )
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("application/json")
    assert "mcp-session-id" not in response.headers
    names = [t["name"] for t in response.json()["result"]["tools"]]
    assert names == ["memory_rewrite", "conversation_search"]


def test_no_event_stream_is_held_open_and_bodies_are_bounded(trusted: Api) -> None:
    """Stateless: a GET (the server-to-client stream) has nothing to carry, so it is refused
    rather than held open; a body over the message limit is refused before it is parsed."""
    got = httpx2.get(_url(trusted), headers={"accept": "text/event-stream"}, timeout=30)
    assert got.status_code == 405
    assert got.headers["allow"] == "POST"
    too_large = httpx2.post(
        _url(trusted),
        content=b" " * (5 << 20),
        headers={"content-type": "application/json", "accept": "application/json"},
        timeout=30,
    )
    assert too_large.status_code == 413


def test_another_host_name_is_refused_on_loopback(trusted: Api) -> None:
    """The port's DNS-rebinding guard covers /mcp as every other route."""
    response = httpx2.post(
        _url(trusted),
        json={"jsonrpc": "2.0", "id": 1, "method": "tools/list"},
        headers={
            "accept": "application/json, text/event-stream",
            "host": "evil.example:8080",
            **dict(trusted.who("ana")),
        },
        timeout=30,
    )
    assert response.status_code == 403


# ---- turns ----


def _inspection(api: Api, principal: str, conversation: str, turn: str) -> Any:
    return api.search.GetTurnInspection(
        search_pb.GetTurnInspectionRequest(
            turn=block_pb.TurnReference(conversation_id=conversation, turn_id=turn)
        ),
        metadata=tuple(api.who(principal)),
    ).inspection


def test_a_turn_named_in_meta_carries_the_render_and_the_writes(trusted: Api) -> None:
    async def main() -> None:
        async with _session(trusted, dict(trusted.who("ana"))) as session:
            await session.read_resource(PROMPT_SECTION_URI, meta=_meta("c-mcp", "7"))
            result = await session.call_tool(
                "memory_rewrite", {"text": "Preferred name: Ana"}, meta=_meta("c-mcp", "7")
            )
            assert result.is_error is False, _text(result)

    _run(main)
    inspection = _inspection(trusted, "ana", "c-mcp", "7")
    assert len(inspection.renders) == 1
    assert [list(w.added_lines) for w in inspection.writes] == [["Preferred name: Ana"]]


def test_without_meta_each_request_is_a_turn_of_its_own(trusted: Api) -> None:
    """So the cap of failed writes per turn never carries over to the next request."""
    too_long = "x" * 4001

    async def main() -> None:
        async with _session(trusted, dict(trusted.who("bo"))) as session:
            for _ in range(4):
                result = await session.call_tool("memory_rewrite", {"text": too_long})
                assert result.is_error is True
                assert "1 of 3" in _text(result)  # the first failed write of its turn
            in_one_turn = [
                await session.call_tool(
                    "memory_rewrite", {"text": too_long}, meta=_meta("c-cap", "1")
                )
                for _ in range(4)
            ]
            assert "3 of 3" in _text(in_one_turn[2])
            assert _text(in_one_turn[3]) != _text(in_one_turn[2])  # the fourth: not attempted

    _run(main)
    assert _inspection(trusted, "bo", "c-cap", "1").failed_write_count == 3


@pytest.mark.parametrize(
    "meta",
    [{CONVERSATION_META: "c-1"}, {TURN_META: "1"}, {CONVERSATION_META: "c-1", TURN_META: 1}],
    ids=["no-turn-id", "no-conversation", "not-a-string"],
)
def test_half_a_turn_in_meta_is_the_hosts_mistake(trusted: Api, meta: dict[str, Any]) -> None:
    async def main() -> None:
        async with _session(trusted, dict(trusted.who("cy"))) as session:
            with pytest.raises(MCPError) as caught:
                await session.call_tool(
                    "memory_rewrite", {"text": "Name: Cy"}, meta=cast(RequestParamsMeta, meta)
                )
            assert TURN_META in caught.value.message

    _run(main)
    stored = trusted.blocks.GetMemoryBlock(
        blocks_pb.GetMemoryBlockRequest(), metadata=tuple(trusted.who("cy"))
    )
    assert stored.memory_block.text == ""


def test_invalid_turn_ids_get_the_servers_refusal(trusted: Api) -> None:
    async def main() -> None:
        async with _session(trusted, dict(trusted.who("di"))) as session:
            with pytest.raises(MCPError) as caught:
                await session.call_tool(
                    "memory_rewrite", {"text": "Name: Di"}, meta=_meta("c-1", "")
                )
            assert caught.value.data == {"status": "INVALID_ARGUMENT"}

    _run(main)


# ---- identity: trusted headers and jwt, exactly as every other call ----


def test_trusted_headers_name_the_person(trusted: Api) -> None:
    async def write(principal: str) -> None:
        async with _session(trusted, dict(trusted.who(principal))) as session:
            result = await session.call_tool("memory_rewrite", {"text": f"Name: {principal}"})
            assert result.is_error is False, _text(result)

    async def main() -> None:
        await write("ana")
        await write("bo")

    _run(main)
    for principal in ("ana", "bo"):
        stored = trusted.blocks.GetMemoryBlock(
            blocks_pb.GetMemoryBlockRequest(), metadata=tuple(trusted.who(principal))
        )
        assert stored.memory_block.text == f"Name: {principal}"


def _token(tenant: str, principal: str, secret: str = SECRET) -> str:
    claims = {"tenant": tenant, "sub": principal, "aud": AUDIENCE, "exp": int(time.time()) + 300}
    return jwt.encode(claims, secret, algorithm="HS256")


@pytest.fixture(scope="module")
def jwt_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Api]:
    settings = server_settings(
        "sqlite",
        None,  # type: ignore[arg-type]
        tmp_path_factory.mktemp("mcp-http-jwt"),
        http_listen="127.0.0.1:0",
        auth="jwt",
        jwt_hs256_secret=SECRET,
        jwt_audience=AUDIENCE,
    )
    with serving(settings) as api:
        yield api


@pytest.fixture
def jwt_api(jwt_server: Api) -> Api:
    """The module's jwt-mode server, as a tenant of this test's own."""
    return dataclasses.replace(jwt_server, tenant=f"t-{uuid.uuid4().hex[:10]}")


def test_jwt_mode_a_token_serves_the_tools_as_its_person(jwt_api: Api) -> None:
    bearer = {"authorization": f"Bearer {_token(jwt_api.tenant, 'ana')}"}

    async def main() -> None:
        async with _session(jwt_api, bearer) as session:
            listed = await session.list_tools()
            assert [t.name for t in listed.tools] == ["memory_rewrite", "conversation_search"]
            result = await session.call_tool("memory_rewrite", {"text": "Preferred name: Ana"})
            assert result.is_error is False, _text(result)

    _run(main)
    stored = jwt_api.blocks.GetMemoryBlock(
        blocks_pb.GetMemoryBlockRequest(), metadata=tuple(bearer.items())
    )
    assert stored.memory_block.text == "Preferred name: Ana"


@pytest.mark.parametrize(
    "headers",
    [
        {},
        {"authorization": "Bearer forged"},
        {"authorization": "wrong-signature"},
        {"x-memoria-tenant": "TENANT", "x-memoria-principal": "ana"},
    ],
    ids=["missing", "not-a-jwt", "wrong-signature", "trusted-headers"],
)
def test_jwt_mode_refuses_a_request_without_a_token_it_accepts(
    jwt_api: Api, headers: dict[str, str]
) -> None:
    tenant = jwt_api.tenant
    if headers.get("authorization") == "wrong-signature":
        other = "another-hs256-secret-0123456789abcdef"
        headers = {"authorization": f"Bearer {_token(tenant, 'ana', secret=other)}"}
    headers = {k: v.replace("TENANT", tenant) for k, v in headers.items()}

    async def main() -> None:
        async with _session(jwt_api, headers) as session:
            with pytest.raises(MCPError) as caught:
                await session.list_tools()
            assert caught.value.code == UNAUTHENTICATED_CODE
            with pytest.raises(MCPError) as caught:
                await session.read_resource(PROMPT_SECTION_URI)
            assert caught.value.code == UNAUTHENTICATED_CODE
            # A tool call: the model reads the server's words for it, as from every adapter.
            refused = await session.call_tool("memory_rewrite", {"text": "Preferred name: Eve"})
            assert refused.is_error is True
            assert _text(refused).startswith("Not saved: this person's identity is not confirmed")

    _run(main)
    valid = [("authorization", f"Bearer {_token(tenant, 'ana')}")]
    stored = jwt_api.blocks.GetMemoryBlock(blocks_pb.GetMemoryBlockRequest(), metadata=tuple(valid))
    assert stored.memory_block.text == ""


def test_a_header_grpc_cannot_carry_is_refused_like_a_missing_identity(trusted: Api) -> None:
    """Not printable ASCII: it could name no one (server/domain/ids.py), as on Connect."""

    async def main() -> None:
        headers = {
            "x-memoria-tenant": trusted.tenant.encode(),
            "x-memoria-principal": "an\u00e4".encode(),
        }
        async with _session(trusted, headers) as session:  # type: ignore[arg-type]
            with pytest.raises(MCPError) as caught:
                await session.list_tools()
            assert caught.value.code == UNAUTHENTICATED_CODE
            assert "not printable ASCII" in caught.value.message

    _run(main)
