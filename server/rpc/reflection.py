"""Server reflection that also answers for method symbols, so ghz and grpcurl work.

Stock grpc-python reflection cannot resolve a method symbol such as
`memoria.v1.MemoryBlockService.RenderMemoryBlock` (grpc/grpc#34743, open in 1.85):
FileContainingSymbol answers NOT_FOUND, and `ghz --call` asks for exactly that. The mixin
falls back to the enclosing service, as the reflection servers of other languages do.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import grpc
from grpc_reflection.v1alpha import reflection, reflection_pb2_grpc


class MethodSymbolFallback:
    """Mixin for a ReflectionServicer (sync or aio): FileContainingSymbol also accepts
    `<service>.<method>`."""

    _pool: Any

    def _file_containing_symbol(self, request: Any, fully_qualified_name: str) -> Any:
        parent, _, method = fully_qualified_name.rpartition(".")
        try:
            if method in self._pool.FindServiceByName(parent).methods_by_name:
                fully_qualified_name = parent
        except KeyError:
            pass  # not "<service>.<method>": look the symbol up as it is
        return super()._file_containing_symbol(request, fully_qualified_name)  # type: ignore[misc]


class MethodAwareReflectionServicer(MethodSymbolFallback, reflection.ReflectionServicer):
    """The sync ReflectionServicer with the method-symbol fallback."""


def enable_reflection(service_names: Iterable[str], server: grpc.Server) -> None:
    """Serve reflection for `service_names` (plus the reflection service itself)."""
    names = (*service_names, reflection.SERVICE_NAME)
    reflection_pb2_grpc.add_ServerReflectionServicer_to_server(
        MethodAwareReflectionServicer(names), server
    )
