"""The builders the composition root (server/runtime/app.py) calls, one module per part: the
stores, the embedder and the chunk index, conversation search, the domain services, who a
caller is, the gRPC server, the HTTP gateway and the indexing worker. Each builds its part
from the settings once; a start that cannot go on raises StartupRefusal, naming the settings
to look at."""

from __future__ import annotations

from datetime import UTC, datetime


def utc_now() -> datetime:
    """The clock every service is given (tests give theirs)."""
    return datetime.now(UTC)
