"""A look at the ports before anything is built: a port another process holds refuses the
start at once, in one line naming the setting, instead of after the model has loaded (and
below gRPC's own log line about it)."""

from __future__ import annotations

import socket

from server.runtime.settings import Settings, StartupRefusal, listen_host


def refuse_taken_ports(settings: Settings) -> None:
    """Refuse the start when the gRPC or the HTTP address cannot be bound now. Port 0 (any
    free one) and `--processes N` (whose processes share the port on purpose) are not
    probed; a port taken between this look and the real bind still fails, in one line too."""
    if settings.serve.processes > 1:
        return
    for listen, name in ((settings.serve.listen, "listen"), (settings.http.listen, "http_listen")):
        if listen is not None and (problem := _bind_problem(listen)) is not None:
            raise StartupRefusal(f"cannot listen on {listen}: {problem}", name)


def _bind_problem(listen: str) -> str | None:
    """Why `listen` (HOST:PORT) cannot be bound, or None (port 0: never a problem)."""
    port = int(listen.rpartition(":")[2])
    if port == 0:
        return None
    host = listen_host(listen) or None  # ":50051": every interface, as gRPC reads it
    try:
        addresses = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except socket.gaierror as error:
        return error.strerror
    for family, kind, protocol, _, address in addresses:
        with socket.socket(family, kind, protocol) as probe:
            # As the servers bind: a port in TIME_WAIT after a restart is free.
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                probe.bind(address)
            except OSError as error:
                return error.strerror or str(error)
    return None
