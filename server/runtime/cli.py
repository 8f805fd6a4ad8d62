"""The `memoria` command: `serve` the gRPC service, run an indexing `worker`, `migrate` a
database schema, `compact` or `reindex` the chunk index, and, as clients of a running server,
serve the model's tools over MCP (`mcp`), `export` and `import` a person's data; `token` mints
a token for trying jwt mode locally."""

from __future__ import annotations

import argparse
import gc
import json
import logging
import os
import signal
import sys
from pathlib import Path
from types import FrameType
from typing import TYPE_CHECKING, Any

from server.runtime import token_cli
from server.runtime.settings import (
    BY_FLAT_NAME,
    SETTINGS,
    InvalidSettings,
    Settings,
    StartupRefusal,
    listen_host,
    naming,
)

if TYPE_CHECKING:
    from server.domain.model import Owner

log = logging.getLogger("memoria")


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="memoria", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    serve = sub.add_parser("serve", help="serve the gRPC API (embedded default: no flags needed)")
    serve.add_argument("--listen", help="HOST:PORT (default 127.0.0.1:50051; port 0 picks one)")
    serve.add_argument("--data-dir", type=Path, help="embedded default's data directory")
    serve.add_argument("--database-url", help="postgresql+psycopg://service-role@host/db")
    serve.add_argument("--qdrant-url", help="Qdrant server URL; unset: embedded engine")
    serve.add_argument(
        "--qdrant-grpc-port", type=int, help="Qdrant gRPC port (default: the URL's port + 1)"
    )
    serve.add_argument("--auth", choices=["auto", "jwt", "trusted-headers"])
    serve.add_argument(
        "--http-listen",
        help="HOST:PORT for the settings page, Connect and gRPC-Web (default: off; "
        "`make serve` uses 127.0.0.1:8080)",
    )
    serve.add_argument("--port-file", type=Path, help="write the bound port here once serving")
    serve.add_argument(
        "--processes",
        "--workers",  # its first name, kept as an alias: "worker" now means indexing only
        dest="processes",
        type=int,
        help="serving processes on the one port (default 1; more need PostgreSQL and a Qdrant "
        "server); --workers is the same flag",
    )
    # Set by the parent of `--processes N` on each of its children (server/runtime/processes.py).
    serve.add_argument("--process-index", type=int, help=argparse.SUPPRESS)
    work = sub.add_parser(
        "worker",
        help="index accepted turns in this process (PostgreSQL and a Qdrant server only)",
    )
    work.add_argument("--database-url", help="postgresql+psycopg://service-role@host/db")
    work.add_argument("--qdrant-url", help="the Qdrant server, e.g. http://qdrant:6333")
    work.add_argument(
        "--qdrant-grpc-port", type=int, help="Qdrant gRPC port (default: the URL's port + 1)"
    )
    compact = sub.add_parser(
        "compact",
        help="vacuum the embedded chunk index (deleted and replaced chunks); server stopped",
    )
    compact.add_argument("--data-dir", type=Path)
    reindex = sub.add_parser(
        "reindex",
        help="encode stored chunks again in the current keyword representation now, with "
        "progress (servers and workers also do it in the background); embedded: server stopped",
    )
    reindex.add_argument("--data-dir", type=Path)
    # A scope, never named like an identity: --tenant/--principal say who calls, elsewhere.
    reindex.add_argument(
        "--only-tenant",
        metavar="TENANT",
        help="only this tenant's chunks (default: every tenant's)",
    )
    reindex.add_argument(
        "--only-principal",
        metavar="PRINCIPAL",
        help="only this principal's chunks (needs --only-tenant)",
    )
    reindex.add_argument("--qdrant-url", help="the Qdrant server, e.g. http://qdrant:6333")
    reindex.add_argument(
        "--qdrant-grpc-port", type=int, help="Qdrant gRPC port (default: the URL's port + 1)"
    )
    mcp = sub.add_parser(
        "mcp",
        help="serve the model's tools and memory prompt section over MCP (stdio or HTTP), as a "
        "client of a running Memoria server",
    )
    _add_mcp_arguments(mcp)
    exp = sub.add_parser(
        "export",
        help="write everything held about the caller as JSON Lines, as a client of a running "
        "server",
    )
    imp = sub.add_parser(
        "import",
        help="load a `memoria export` file into the deployment at --server, as the caller "
        "(idempotent)",
    )
    _add_export_arguments(exp, imp)
    token_cli.add_arguments(
        sub.add_parser(
            "token",
            help="print a person's HS256 token signed with this deployment's jwt settings "
            "(MEMORIA_JWT_HS256_SECRET), for trying jwt mode locally",
        )
    )
    mig = sub.add_parser("migrate", help="bring a database schema to the newest revision")
    mig.add_argument("--database-url", help="the schema owner's URL (default: the embedded one)")
    mig.add_argument("--data-dir", type=Path)
    mig.add_argument("--app-role", help="PostgreSQL service role to grant table access to")
    return parser


def _settings(args: argparse.Namespace) -> Settings:
    """The settings: the flags given (each flag's dest is its setting's flat name) over the
    environment."""
    overrides: dict[str, Any] = {
        setting.flat: value
        for setting in SETTINGS
        if (value := getattr(args, setting.flat, None)) is not None
    }
    return Settings(**overrides)


def setting_flags(command: str | None = None) -> dict[str, list[str]]:
    """The flags that set a setting (by flat name), of one command or of every command: read
    from the parser, where they are declared."""
    flags: dict[str, list[str]] = {}
    for name, parser in _subcommands(_parser()).items():
        if command is not None and name != command:
            continue
        for action in parser._actions:
            if action.dest in BY_FLAT_NAME and action.help != argparse.SUPPRESS:
                for flag in action.option_strings:
                    if flag not in flags.setdefault(action.dest, []):
                        flags[action.dest].append(flag)
    return flags


def _subcommands(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    """The parser of each subcommand (argparse keeps them on its subparsers action)."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return dict(action.choices)
    return {}


def _add_mcp_arguments(parser: argparse.ArgumentParser) -> None:
    """`memoria mcp` is the client package's MCP server (clients/python, memoria_client),
    installed in the development venv; an install of the server alone (the container image)
    has no such package, and every other command must still parse."""
    try:
        from memoria_client.mcp_cli import add_arguments
    except ImportError:
        parser.set_defaults(mcp_missing=True)
        return
    add_arguments(parser)


def _add_export_arguments(export: argparse.ArgumentParser, load: argparse.ArgumentParser) -> None:
    """`memoria export` and `memoria import` share the client package's connection flags
    (memoria_client/connection.py); without that package every other command must still
    parse, as for `memoria mcp`."""
    try:
        from server.runtime import export_cli
    except ImportError:
        export.set_defaults(client_missing=True)
        load.set_defaults(client_missing=True)
        return
    export_cli.add_arguments(export, importing=False)
    export_cli.add_arguments(load, importing=True)


def main(argv: list[str] | None = None) -> None:
    args = _parser().parse_args(argv)
    if args.command == "mcp":  # a client of a Memoria server: none of the server's settings
        if getattr(args, "mcp_missing", False):
            sys.exit(
                "memoria mcp: needs the client package with its mcp extra: "
                "pip install -c requirements.lock './clients/python[mcp]'"
            )
        from memoria_client.mcp_cli import run

        logging.basicConfig(level=logging.INFO, stream=sys.stderr)
        run(args)
        return
    if args.command in ("export", "import"):  # clients of a server, like mcp
        if getattr(args, "client_missing", False):
            sys.exit(
                f"memoria {args.command}: needs the client package: "
                "pip install -c requirements.lock ./clients/python"
            )
        from server.runtime import export_cli as cli_export

        cli_export.main(args)
        return
    flags = {flat: names[0] for flat, names in setting_flags(args.command).items()}
    try:
        settings = _settings(args)
    except InvalidSettings as error:  # one line per invalid setting, naming what to change
        sys.exit("\n".join(f"memoria {args.command}: {line}" for line in error.lines(flags)))
    from server.telemetry import configure_logging

    configure_logging(settings.serve.log_level)
    from sqlalchemy.exc import OperationalError

    try:
        _run(args, settings)
    except StartupRefusal as refusal:
        sys.exit(f"memoria {args.command}: {refusal.line(flags)}")
    except OperationalError as error:
        # A database that cannot be reached (or refuses the login) is a configuration problem
        # to state in one line, not a traceback of the driver's internals.
        where = naming("database_url", flags)
        sys.exit(
            f"memoria {args.command}: cannot use the database: {_first_line(error)}; check {where}"
        )


def _run(args: argparse.Namespace, settings: Settings) -> None:
    """The command, on its settings."""
    if args.command == "migrate":
        _migrate(settings, args.app_role)
    elif args.command == "worker":
        _worker(settings)
    elif args.command == "compact":
        _compact(settings)
    elif args.command == "reindex":
        _reindex(settings, _owner(args.only_tenant, args.only_principal))
    elif args.command == "token":
        token_cli.run(settings, args)
    elif args.process_index is None and settings.serve.processes > 1:
        _serve_workers(settings, args)
    else:
        _serve(settings, args.port_file, args.process_index)


def _first_line(error: Exception) -> str:
    """The driver's own first line of an error (SQLAlchemy wraps it as `orig`)."""
    cause = getattr(error, "orig", None) or error
    lines = str(cause).strip().splitlines()
    return lines[0] if lines else type(cause).__name__


def _migrate(settings: Settings, app_role: str | None) -> None:
    from server.adapters.sql import migrate
    from server.adapters.sql.engine import create_store_engine, sqlite_url

    url = (
        settings.store.database_url.get_secret_value()
        if settings.store.database_url
        else sqlite_url(settings.store.data_dir)
    )
    if settings.store.database_url is None:
        settings.store.data_dir.mkdir(parents=True, exist_ok=True)
    engine = create_store_engine(url, pool_size=1)
    migrate.upgrade(engine, app_role=app_role)
    engine.dispose()
    log.info("schema is at the newest revision")


def _compact(settings: Settings) -> None:
    """Optimize the embedded chunk index: it never vacuums by itself, and optimizing holds
    every Python thread for seconds to minutes, so it is an offline step (the server holds
    the index's lock while it runs, so this refuses to run beside it)."""
    from server.adapters.qdrant.edge import QdrantEdgeChunkIndex
    from server.runtime.builders.chunks import build_chunk_index
    from server.runtime.builders.embedding import build_embedder

    if settings.qdrant.url is not None:
        sys.exit("memoria compact: a Qdrant server optimizes its collections by itself")
    index = build_chunk_index(settings, build_embedder(settings))
    assert isinstance(index, QdrantEdgeChunkIndex)
    try:
        log.info("optimizing the chunk index in %s", settings.store.data_dir)
        index.optimize()
    finally:
        index.close()
    log.info("done")


def _owner(tenant: str | None, principal: str | None) -> Owner:
    """Whose chunks `memoria reindex` covers, or exit in one line on ids that name nobody."""
    from server.domain.ids import identity_value_problem
    from server.domain.model import Owner

    if principal is not None and tenant is None:
        sys.exit(
            "memoria reindex: --only-principal needs --only-tenant (a principal lives in a tenant)"
        )
    for flag, value in (("--only-tenant", tenant), ("--only-principal", principal)):
        if value is not None and (problem := identity_value_problem(value)):
            sys.exit(f"memoria reindex: {flag} {problem}")
    return Owner(tenant, principal)


def _reindex(settings: Settings, owner: Owner) -> None:
    """Encode every chunk of an older keyword representation again (every tenant's, or the
    owner's), to the end, printing progress (server/domain/reindex.py). Searches keep working
    meanwhile on a Qdrant server; the embedded index belongs to one process, so there it runs
    with the server stopped (a running server does the same in its worker threads)."""
    from server.domain.keywords import KeywordEncoder, keyword_representation
    from server.domain.reindex import KeywordReindexer
    from server.runtime.builders.chunks import build_chunk_index
    from server.runtime.builders.embedding import build_embedder

    embedder = build_embedder(settings)
    index = build_chunk_index(settings, embedder)
    try:
        representation = keyword_representation(embedder.model_id)
        reindexer = KeywordReindexer(index, KeywordEncoder(), owner, representation)

        def show(done: int, total: int) -> None:
            print(f"memoria reindex: {done}/{total} chunks", file=sys.stderr, flush=True)

        done = reindexer.run(REINDEX_BATCH, show)
    finally:
        index.close()
    log.info("reindex done: %d chunks encoded again", done)


REINDEX_BATCH = 256
"""Chunks per step of `memoria reindex` (each step is one scroll and one update request)."""


def _worker(settings: Settings) -> None:
    """Index turns until SIGTERM. Separate worker processes need shared stores: the embedded
    SQLite database and Qdrant engine belong to the one `memoria serve` process that opened
    them (its own worker threads index for it). Built by the same composition root as
    `memoria serve` (server/runtime/builders/worker.py `start_worker`)."""
    import threading

    from server.runtime.builders.worker import start_worker

    if settings.store.embedded or settings.qdrant.embedded:
        sys.exit(
            "memoria worker: needs --database-url and --qdrant-url; the embedded stores belong "
            "to the `memoria serve` process, whose own worker threads index for it"
        )
    _log_settings(settings)
    running = start_worker(settings)
    stopped = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stopped.set())
    signal.signal(signal.SIGINT, lambda *_: stopped.set())
    log.info("indexing worker running")
    stopped.wait()
    running.stop()
    log.info("stopped")


def _log_settings(settings: Settings) -> None:
    """The settings in effect, one line per group with secrets masked: readable in the
    message, and whole under `settings` in the JSON line for a machine to read."""
    for group, values in settings.redacted().items():
        text = " ".join(f"{key}={json.dumps(value)}" for key, value in values.items())
        log.info("settings %s: %s", group, text, extra={"fields": {"settings": {group: values}}})
    for name in Settings.unknown_env(os.environ):
        log.warning("ignoring unknown environment variable %s", name)


def _serve_workers(settings: Settings, args: argparse.Namespace) -> None:
    """`--processes N`: this process supervises N serving processes on one port."""
    from server.runtime.processes import Supervisor, name_this_process, refusal

    if (reason := refusal(settings)) is not None:
        sys.exit(f"memoria serve: {reason}")
    name_this_process("supervisor")
    _log_settings(settings)
    # The children get the setting flags given here (so a URL given in the environment stays
    # there), but their own --listen (the reserved port) and --processes.
    child_args = [
        str(part)
        for flat, names in setting_flags("serve").items()
        if flat not in ("listen", "processes") and (value := getattr(args, flat)) is not None
        for part in (names[0], value)
    ]
    sys.exit(Supervisor(settings, child_args, args.port_file).run())


def _serve(settings: Settings, port_file: Path | None, worker_index: int | None = None) -> None:
    from server.runtime.app import start

    if worker_index is not None:  # one of `--processes N`: the parent logged the settings
        from server.runtime.processes import name_this_process, refusal

        if (reason := refusal(settings)) is not None:
            sys.exit(f"memoria serve: {reason}")
        name_this_process(f"worker-{worker_index}")
    else:
        _log_settings(settings)
    if settings.serve.pin_cpu:  # before start: every thread it creates inherits the CPU
        from server.runtime.processes import pin_this_process

        if not hasattr(os, "sched_setaffinity"):
            sys.exit("memoria serve: MEMORIA_PIN_CPU needs Linux (sched_setaffinity)")
        log.info("serving on CPU %d only (MEMORIA_PIN_CPU)", pin_this_process(worker_index))
    running = start(settings)
    # Everything built so far (the embedding model, the stemmer, gRPC, SQLAlchemy) lives as
    # long as the process: out of the collector's reach, a full collection scans only what
    # calls allocate. Measured on the rewrite path: full collections took ~80 ms each, about
    # 130,000 objects scanned every time (docs/decisions.md).
    gc.freeze()
    log.info(
        "serving memoria on port %d (auth=%s, store=%s, pid %d)",
        running.port,
        settings.effective_auth,
        "sqlite" if settings.store.embedded else "postgresql",
        os.getpid(),
    )
    if running.web is not None:
        log.info(
            "serving the settings page, Connect, gRPC-Web and MCP (/mcp) on http://%s/",
            f"{listen_host(settings.http.listen or '')}:{running.web.port}",
        )
    if port_file is not None:
        port_file.write_text(str(running.port))

    def on_signal(signum: int, _frame: FrameType | None) -> None:
        log.info("signal %d: draining for up to %ss", signum, settings.serve.shutdown_grace_seconds)
        running.stop(settings.serve.shutdown_grace_seconds)

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    running.wait()
    running.stop(0)
    log.info("stopped")


if __name__ == "__main__":
    main()
