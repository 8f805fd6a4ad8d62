"""Checks an installed memoria-client against a running server (scripts/test-clients.sh).

Run by the Python of a fresh virtual environment into which only `pip install clients/python`
went, from a directory outside the repository, so every import comes from the installed wheel:
the package must carry its stubs and tool files and need nothing of the server.
MEMORIA_SERVER names the server (host:port) in trusted-headers mode.
"""

from __future__ import annotations

import importlib.util
import os
import sys
import uuid

import grpc

import memoria.v1.memory_block_service_pb2
import memoria_client
from memoria_client import SHAPES, MemoriaTurnAdapter, load_tools


def main() -> None:
    """Fail (non-zero exit, with the reason) unless the installed package works end to end."""
    site = os.path.dirname(os.path.dirname(memoria_client.__file__))
    for module in (memoria_client, memoria.v1.memory_block_service_pb2):
        assert module.__file__ and module.__file__.startswith(site), module.__file__
    assert "site-packages" in site, site
    for server_only in ("server", "sqlalchemy", "qdrant_client", "psycopg"):
        assert importlib.util.find_spec(server_only) is None, f"{server_only} is importable"
    for shape in SHAPES:
        names = [t.get("name") or t["function"]["name"] for t in load_tools(shape)]
        assert names == ["memory_rewrite", "conversation_search"], (shape, names)

    channel = grpc.insecure_channel(os.environ["MEMORIA_SERVER"])
    who = [("x-memoria-tenant", f"pkg-{uuid.uuid4().hex[:8]}"), ("x-memoria-principal", "ana")]
    adapter = MemoriaTurnAdapter(channel, who)
    for shape in SHAPES:
        assert adapter.tools(shape) == load_tools(shape), shape
    adapter.start_turn("c-1", "1")
    saved = adapter.execute("memory_rewrite", '{"text": "Preferred name: Ana"}')
    assert not saved.is_error and "+ Preferred name: Ana" in saved.text, saved
    section = adapter.prompt_section()
    assert section.endswith("\nPreferred name: Ana"), section
    missing = adapter.execute("memory_rewrite", "{}")
    assert missing.is_error and missing.text.startswith("Not sent:"), missing
    found = adapter.execute("conversation_search", {"query": "anything"})
    assert not found.is_error and found.text.startswith("No past conversation matched"), found
    adapter.finish_turn("Call me Ana.", "I will, Ana.")
    assert adapter.flush(timeout=30) == 0
    channel.close()
    print(f"ok installed memoria-client ({site})")


if __name__ == "__main__":
    sys.exit(main())
