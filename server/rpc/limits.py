"""Call admission: no caller, authenticated or not, can starve the others of the server.

Why: grpc's sync server receives a unary call's request on a pool thread and waits for it
there without a time limit. Four half-sent requests (headers and part of a body), or four
reflection streams that send nothing, held the four handler threads, and every other caller's
calls timed out; about 260 of them made everyone else get RESOURCE_EXHAUSTED; idle TCP
connections were never closed (issue 16). The sync server stays (docs/decisions.md); this
module changes what a waiting call costs and who pays when there are too many:

- **Receiving is bounded in time.** Every method is served as a client-streaming one (the wire
  is the same: a unary caller sends one message), so its behaviour starts at once and reads the
  request itself, under `ReceiveBounds`: a request not received within `receive_timeout`
  seconds is cancelled (the caller sees CANCELLED) and its thread is free again. A long-lived
  stream's later messages get `stream_idle_timeout` each.
- **Waiting costs a sleeping thread, not a handler slot.** The pool that receives is large
  (`max_receiving` threads, made only when needed); executing Memoria work is held to
  `executing` calls at once (MEMORIA_THREADS, the measured optimum for one process's GIL) by a
  permit taken only once the request is in.
- **A burst is answered, overload is refused with a reason.** At most `max_calls` calls are
  in progress at once (receiving, waiting to execute, executing); a call beyond that is not
  started and gets RESOURCE_EXHAUSTED with ERROR_REASON_OVERLOADED and a RetryInfo
  (server/rpc/errors.py), never a bare transport refusal. HTTP/2 caps one connection's
  streams (`grpc.max_concurrent_streams`; its client queues its further calls), and the
  gRPC server builder turns off grpc's count of streams not yet freed, which refused calls of
  clients within the cap with RST_STREAM.
- **A connection cannot hold everyone's receiving.** While `max_receiving` calls are waiting
  for their requests, a new call is refused the same way if its connection already holds at
  least its fair share of the waiting (`max_receiving` / connections waiting); a connection
  with fewer (a well-behaved caller's requests arrive in microseconds, so it holds none) is
  still let in, up to a hard ceiling of twice `max_receiving`. Idle connections are closed
  (the channel arguments of the gRPC server builder).
- **Long-lived streams run on their own threads.** Health Watch and server reflection go to a
  pool of their own (`max_streams` at once, then RESOURCE_EXHAUSTED), so they never occupy a
  thread that serves calls, and a stream waiting for its next message is bounded as above.

Each refusal is counted and logged at most once per `LOG_INTERVAL_SECONDS`, so a flood cannot
flood the log.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from concurrent import futures
from dataclasses import dataclass
from typing import Any

import grpc

from server.rpc.errors import overloaded_status
from server.rpc.interceptor import Handler, UnaryWrappingInterceptor
from server.rpc.ratelimit import RateLimitedLog

log = logging.getLogger(__name__)

LOG_INTERVAL_SECONDS = 60.0

REAP_TICK_SECONDS = 0.25
"""How often the reaper looks for requests past their bound (the bound's precision)."""

SPARE_THREADS = 8
"""Pool threads beyond `max_calls`: with every admitted call holding a thread, a call over the
limit still finds one to be refused on at once."""


@dataclass(frozen=True)
class Limits:
    """The admission limits (configured in server/runtime/settings/groups.py, the variables in
    docs/configuration.md; what they do: docs/operations.md, "Limits")."""

    executing: int
    max_calls: int
    max_receiving: int
    max_streams: int
    receive_timeout: float
    stream_idle_timeout: float

    @property
    def pool_threads(self) -> int:
        """Threads of the pool that receives and runs calls: every admitted call holds one
        (receiving, waiting for a permit or executing), and the refusals still find a free
        one."""
        return self.max_calls + SPARE_THREADS


class ReceiveBounds:
    """Cancels calls whose next request message has not arrived by their deadline.

    One daemon thread for the process; a call registers before it reads and leaves when the
    message is in (a dict insert and delete under a lock, about a microsecond).
    """

    def __init__(self, *, tick: float = REAP_TICK_SECONDS) -> None:
        self._pending: dict[int, tuple[float, grpc.ServicerContext]] = {}
        self._lock = threading.Lock()
        self._tick = tick
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="receive-bounds", daemon=True)
        self.cancelled = 0

    def start(self) -> None:
        """Start reaping."""
        self._thread.start()

    def stop(self) -> None:
        """Stop reaping (calls still waiting end with the server)."""
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(self._tick + 1.0)

    def receive(self, requests: Iterator[Any], context: grpc.ServicerContext, bound: float) -> Any:
        """The next message of `requests`, or StopIteration; the call is cancelled if it does
        not come within `bound` seconds."""
        key = id(context)
        with self._lock:
            self._pending[key] = (time.monotonic() + bound, context)
        try:
            return next(requests)
        finally:
            with self._lock:
                self._pending.pop(key, None)

    def _run(self) -> None:
        while not self._stop.wait(self._tick):
            now = time.monotonic()
            with self._lock:
                late = [key for key, (deadline, _) in self._pending.items() if deadline <= now]
                contexts = [self._pending.pop(key)[1] for key in late]
            for context in contexts:
                context.cancel()  # type: ignore[no-untyped-call]  # the waiting thread wakes
            if contexts:
                self.cancelled += len(contexts)
                log.debug("cancelled %d calls whose request did not arrive", len(contexts))


class Admission:
    """Counts the calls in progress and those waiting for their request (per connection), and
    decides which calls start and which wait."""

    def __init__(self, limits: Limits) -> None:
        self._limits = limits
        self._waiting: Counter[str] = Counter()
        self._total = 0
        self._calls = 0
        self._lock = threading.Lock()
        self._refused = RateLimitedLog(log, LOG_INTERVAL_SECONDS)
        self._overloaded = RateLimitedLog(log, LOG_INTERVAL_SECONDS)

    def begin(self) -> bool:
        """Start a call (False: `max_calls` are in progress; refuse it)."""
        with self._lock:
            if self._calls >= self._limits.max_calls:
                self._overloaded.warning("refused calls over the limit of calls in progress")
                return False
            self._calls += 1
            return True

    def end(self) -> None:
        """A call begun has ended."""
        with self._lock:
            self._calls -= 1

    def enter(self, peer: str) -> bool:
        """Admit a call of connection `peer` to wait for its request (False: refuse it)."""
        limit = self._limits.max_receiving
        with self._lock:
            if self._total >= limit:
                fair_share = limit / max(1, len(self._waiting))
                if self._waiting[peer] >= fair_share or self._total >= 2 * limit:
                    self._refused.warning(
                        "refused calls of connections holding too many unsent requests"
                    )
                    return False
            self._waiting[peer] += 1
            self._total += 1
            return True

    def leave(self, peer: str) -> None:
        """The call's request is in (or it ended)."""
        with self._lock:
            self._total -= 1
            left = self._waiting[peer] - 1
            if left:
                self._waiting[peer] = left
            else:
                del self._waiting[peer]


class AdmissionInterceptor(UnaryWrappingInterceptor):
    """Serves every method under the limits (see the module docstring); outermost, so the
    handlers it wraps are the ones the other interceptors built."""

    def __init__(self, limits: Limits) -> None:
        super().__init__()
        self._limits = limits
        self.bounds = ReceiveBounds()
        self._admission = Admission(limits)
        # Permits to execute, as tokens in a C-implemented queue: taking and returning one
        # (and waking a waiter) happens in C, where threading's semaphore runs a Python
        # Condition; under 16 calls in flight every call waits for a permit.
        self._permits: queue.SimpleQueue[None] = queue.SimpleQueue()
        for _ in range(limits.executing):
            self._permits.put(None)
        self._streams = threading.BoundedSemaphore(limits.max_streams)
        self.stream_pool = futures.ThreadPoolExecutor(
            max_workers=limits.max_streams + 2, thread_name_prefix="stream"
        )
        self._streams_refused = RateLimitedLog(log, LOG_INTERVAL_SECONDS)

    def start(self) -> None:
        """Start the receive bounds' reaper."""
        self.bounds.start()

    def stop(self) -> None:
        """Stop the reaper and the streams' pool (after the server stopped)."""
        self.bounds.stop()
        self.stream_pool.shutdown(wait=False, cancel_futures=True)

    def _wrap_handler(self, handler: Handler, method: str) -> Handler:
        """Every method, unary or streaming, served under the limits (kept per method by the
        base class)."""
        deserializer = handler.request_deserializer
        serializer = handler.response_serializer
        if handler.unary_unary is not None:
            return grpc.stream_unary_rpc_method_handler(
                self._unary(handler.unary_unary), deserializer, serializer
            )
        if handler.stream_unary is not None:
            return grpc.stream_unary_rpc_method_handler(
                self._unary(handler.stream_unary, streaming=True), deserializer, serializer
            )
        if handler.unary_stream is not None:
            behavior = self._stream(handler.unary_stream, streaming=False)
        else:
            assert handler.stream_stream is not None
            behavior = self._stream(handler.stream_stream, streaming=True)
        # grpc runs a behaviour carrying `experimental_thread_pool` on that pool.
        behavior.experimental_thread_pool = self.stream_pool  # type: ignore[attr-defined]
        return grpc.stream_stream_rpc_method_handler(behavior, deserializer, serializer)

    def _first(self, requests: Iterator[Any], context: grpc.ServicerContext) -> Any:
        """The call's first request, received under the bound; None when it never came."""
        peer = context.peer()
        if not self._admission.enter(peer):
            context.abort_with_status(
                overloaded_status(
                    "this connection holds too many requests that were never sent in full"
                )
            )
        try:
            return self.bounds.receive(requests, context, self._limits.receive_timeout)
        except StopIteration:
            return None
        finally:
            self._admission.leave(peer)

    def _unary(self, inner: Callable[..., Any], *, streaming: bool = False) -> Callable[..., Any]:
        def behavior(requests: Iterator[Any], context: grpc.ServicerContext) -> Any:
            if not self._admission.begin():
                context.abort_with_status(
                    overloaded_status(
                        f"the server has {self._limits.max_calls} calls in progress; "
                        "retry after the RetryInfo delay"
                    )
                )
            try:
                if streaming:  # a client-streaming method reads its own requests, bounded
                    argument: Any = self._idle_bounded(requests, context, first=True)
                else:
                    argument = self._first(requests, context)
                    if argument is None:
                        context.abort(
                            grpc.StatusCode.CANCELLED, "no request message arrived in time"
                        )
                self._permits.get()
                try:
                    return inner(argument, context)
                finally:
                    self._permits.put(None)
            finally:
                self._admission.end()

        return behavior

    def _stream(self, inner: Callable[..., Any], *, streaming: bool) -> Callable[..., Any]:
        def behavior(requests: Iterator[Any], context: grpc.ServicerContext) -> Iterator[Any]:
            if not self._streams.acquire(blocking=False):
                self._streams_refused.warning("refused long-lived streams over the limit")
                context.abort_with_status(
                    overloaded_status(
                        f"at most {self._limits.max_streams} long-lived streams at once"
                    )
                )
            try:
                if streaming:
                    yield from inner(self._idle_bounded(requests, context, first=True), context)
                    return
                request = self._first(requests, context)
                if request is None:
                    return
                yield from inner(request, context)
            finally:
                self._streams.release()

        return behavior

    def _idle_bounded(
        self, requests: Iterator[Any], context: grpc.ServicerContext, *, first: bool
    ) -> Iterator[Any]:
        """`requests`, each message bounded: the first by the receive timeout, later ones by
        the stream idle timeout."""
        if first:
            request = self._first(requests, context)
            if request is None:
                return
            yield request
        while True:
            try:
                yield self.bounds.receive(requests, context, self._limits.stream_idle_timeout)
            except StopIteration:
                return
