"""One vocabulary for every client command (memoria_client/connection.py): `memoria export`,
`memoria import`, `memoria mcp` and the client package's `memoria-mcp` take `--server`,
`--token`, `--tenant`, `--principal` (and their MEMORIA_* variables) in the same way; the
earlier names keep working but stay out of `--help`; `memoria reindex` names its scope
`--only-tenant`/`--only-principal`, never like an identity. Also the words of the export's
and import's summaries."""

from __future__ import annotations

import argparse
from collections import Counter
from collections.abc import Callable

import pytest

from memoria_client import connection, mcp_cli
from server.runtime import export_cli
from server.runtime.cli import _parser

ENV_NAMES = (
    *connection.SERVER_ENV,
    *connection.TOKEN_ENV,
    *connection.TENANT_ENV,
    *connection.PRINCIPAL_ENV,
)
OLD_NAMES = ("--addr", "--target", *ENV_NAMES[1:3], "MEMORIA_MCP_TOKEN", "MEMORIA_MCP_TENANT")


@pytest.fixture(autouse=True)
def no_client_env(monkeypatch: pytest.MonkeyPatch) -> None:
    """Only what a test sets counts (the flags' defaults are read when a parser is built)."""
    for name in ENV_NAMES:
        monkeypatch.delenv(name, raising=False)


def _memoria(command: str) -> Callable[[list[str]], argparse.Namespace]:
    return lambda argv: _parser().parse_args([command, *argv])


def _memoria_mcp(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="memoria-mcp")
    mcp_cli.add_arguments(parser)
    return parser.parse_args(argv)


COMMANDS: dict[str, Callable[[list[str]], argparse.Namespace]] = {
    "export": _memoria("export"),
    "import": lambda argv: _parser().parse_args(["import", "ana.jsonl", *argv]),
    "mcp": _memoria("mcp"),
    "memoria-mcp": _memoria_mcp,
}


@pytest.mark.parametrize("command", COMMANDS)
def test_every_client_command_takes_the_same_flags(command: str) -> None:
    parse = COMMANDS[command]
    args = parse([])
    assert (args.server, args.tls, args.token, args.tenant, args.principal) == (
        "127.0.0.1:50051",
        False,
        None,
        None,
        None,
    )
    args = parse(["--server", "h:1", "--tls", "--token", "tok"])
    assert (args.server, args.tls, args.token) == ("h:1", True, "tok")
    args = parse(["--tenant", "acme", "--principal", "ana"])
    assert connection.metadata(args) == (
        ("x-memoria-tenant", "acme"),
        ("x-memoria-principal", "ana"),
    )
    for old in ("--addr", "--target"):  # the earlier names of --server
        assert parse([old, "h:2"]).server == "h:2"


@pytest.mark.parametrize("command", COMMANDS)
def test_the_environment_names_the_server_and_the_caller(
    command: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    parse = COMMANDS[command]
    monkeypatch.setenv("MEMORIA_SERVER", "h:3")
    monkeypatch.setenv("MEMORIA_TOKEN", "tok")
    monkeypatch.setenv("MEMORIA_TENANT", "acme")
    monkeypatch.setenv("MEMORIA_PRINCIPAL", "ana")
    args = parse([])
    assert (args.server, args.token, args.tenant, args.principal) == ("h:3", "tok", "acme", "ana")
    assert parse(["--server", "h:4", "--principal", "bo"]).server == "h:4"  # a flag wins
    assert connection.metadata(args)[0] == ("authorization", "Bearer tok")


@pytest.mark.parametrize(
    "names",
    [
        ("MEMORIA_ADDR", "MEMORIA_MCP_TOKEN", "MEMORIA_MCP_TENANT", "MEMORIA_MCP_PRINCIPAL"),
        ("MEMORIA_MCP_TARGET", "MEMORIA_MCP_TOKEN", "MEMORIA_MCP_TENANT", "MEMORIA_MCP_PRINCIPAL"),
    ],
)
def test_the_earlier_environment_names_keep_working_and_the_new_ones_win(
    names: tuple[str, str, str, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    for name, value in zip(names, ("old:1", "old-tok", "old-t", "old-p"), strict=True):
        monkeypatch.setenv(name, value)
    for parse in COMMANDS.values():
        args = parse([])
        assert (args.server, args.token, args.tenant, args.principal) == (
            "old:1",
            "old-tok",
            "old-t",
            "old-p",
        )
    monkeypatch.setenv("MEMORIA_SERVER", "new:1")
    monkeypatch.setenv("MEMORIA_TENANT", "new-t")
    args = COMMANDS["mcp"]([])
    assert (args.server, args.tenant) == ("new:1", "new-t")


@pytest.mark.parametrize("command", ["export", "import", "mcp"])
def test_help_shows_the_agreed_names_only(command: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        _parser().parse_args([command, "--help"])
    text = capsys.readouterr().out
    for name in ("--server", "--token", "--tenant", "--principal", "MEMORIA_SERVER"):
        assert name in text
    for old in OLD_NAMES:
        assert old not in text


def test_reindex_scopes_are_not_named_like_identities() -> None:
    args = _parser().parse_args(["reindex", "--only-tenant", "t1", "--only-principal", "ana"])
    assert (args.only_tenant, args.only_principal) == ("t1", "ana")
    with pytest.raises(SystemExit):
        _parser().parse_args(["reindex", "--tenant", "t1"])


def test_the_summaries_say_what_each_kind_counted() -> None:
    counts = Counter(
        {"memory_block": 1, "settings": 1, "audit_event": 12, "turn": 40, "deleted_conversation": 2}
    )
    assert export_cli.summary(counts) == (
        "1 memory block, 1 settings, 12 audit events, 40 turns, 2 deleted conversations"
    )
    assert export_cli.summary(Counter({"turn": 1}), ("turn", "deleted_conversation")) == (
        "1 turn, 0 deleted conversations"
    )
