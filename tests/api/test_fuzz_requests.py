"""Fuzzing a running server: malformed, random and hostile requests on every RPC.

Every Memoria method (read from the contract's descriptors, so a new one is covered without a
change here) and grpc's own health and reflection methods receive, over a raw channel that
sends bytes as they are:
- invalid UTF-8 in each string field, a truncated varint after each field's tag, a tag cut
  short, and valid messages cut at a random point;
- seeded random bytes;
- well-formed messages with hostile values in every field (control, invisible and non-ASCII
  characters, overlong strings, extreme numbers, unknown enum values, out-of-range
  timestamps, unknown fields), under valid, missing and hostile identities.

Every answer must be a clear status: never INTERNAL, UNKNOWN or a timeout, and every error
(grpc's own NOT_FOUND for an unknown health service excepted, the standard health answer)
carries an ErrorInfo of domain memoria.v1 whose reason is in the contract and maps to the
code received. Undecodable bytes from an authenticated caller always answer
INVALID_ARGUMENT / ERROR_REASON_MALFORMED_REQUEST. The server logs no traceback and at most
a few lines about them. A summary of inputs and statuses is printed for the record.
"""

from __future__ import annotations

import collections
import importlib
import logging
import pkgutil
import random
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, TypeAlias

import grpc
import pytest
from google.protobuf import descriptor, message, message_factory
from google.protobuf.descriptor import FieldDescriptor
from grpc_health.v1 import health_pb2
from grpc_reflection.v1alpha import reflection_pb2

import memoria.v1
from memoria.v1 import error_reason_pb2
from server.domain.errors import ErrorReason
from server.rpc.errors import STATUS_OF
from tests.api.conftest import Api, Metadata, error_info, server_settings, serving

if TYPE_CHECKING:
    from google._upb._message import FieldDescriptor as UpbFieldDescriptor

SEED = 1616
RANDOM_INPUTS_PER_METHOD = 12
HOSTILE_MESSAGES_PER_METHOD = 16
TIME_BUDGET_S = 60.0
"""A hard bound for the whole run (it takes a few seconds): the test fails past it."""

HEALTH_CHECK = "/grpc.health.v1.Health/Check"
HEALTH_WATCH = "/grpc.health.v1.Health/Watch"
REFLECTION = "/grpc.reflection.v1alpha.ServerReflection/ServerReflectionInfo"

NEVER = frozenset(
    {grpc.StatusCode.INTERNAL, grpc.StatusCode.UNKNOWN, grpc.StatusCode.DEADLINE_EXCEEDED}
)

Field: TypeAlias = "FieldDescriptor | UpbFieldDescriptor"
"""A message's field as protobuf's stubs type `DESCRIPTOR.fields` (either implementation)."""


@dataclass(frozen=True)
class Method:
    path: str
    request: type[message.Message]
    kind: str  # unary_unary, unary_stream or stream_stream
    memoria: bool


def memoria_methods() -> list[Method]:
    """Every RPC of every service in the generated memoria.v1 package."""
    methods = []
    for info in pkgutil.iter_modules(memoria.v1.__path__):
        if not info.name.endswith("_pb2"):
            continue
        file: descriptor.FileDescriptor = importlib.import_module(
            f"memoria.v1.{info.name}"
        ).DESCRIPTOR
        for service in file.services_by_name.values():
            for method in service.methods:
                assert not (method.client_streaming or method.server_streaming)
                request = message_factory.GetMessageClass(method.input_type)
                path = f"/{service.full_name}/{method.name}"
                methods.append(Method(path, request, "unary_unary", memoria=True))
    return methods


METHODS = [
    *memoria_methods(),
    Method(HEALTH_CHECK, health_pb2.HealthCheckRequest, "unary_unary", memoria=False),
    Method(HEALTH_WATCH, health_pb2.HealthCheckRequest, "unary_stream", memoria=False),
    Method(REFLECTION, reflection_pb2.ServerReflectionRequest, "stream_stream", memoria=False),
]


# --- inputs ---------------------------------------------------------------------------------


def varint(value: int) -> bytes:
    out = bytearray()
    while True:
        low, value = value & 0x7F, value >> 7
        if value:
            out.append(low | 0x80)
        else:
            out.append(low)
            return bytes(out)


def tag(field: Field, wire_type: int) -> bytes:
    return varint(field.number << 3 | wire_type)


BAD_UTF8 = (b"\xff", b"\xc3\x28", b"\xed\xa0\x80", b"ok\xe1", b"\xf4\x90\x80\x80")
"""A lone byte, a broken pair, an encoded surrogate, Latin-1 `á`, a code point past U+10FFFF."""


def undecodable(method: Method, rng: random.Random) -> Iterator[tuple[str, bytes]]:
    """Inputs no decoder accepts for `method`'s request type."""
    fields = method.request.DESCRIPTOR.fields
    for field in fields:
        if field.type == FieldDescriptor.TYPE_STRING:
            for bad in BAD_UTF8:
                yield "invalid-utf8", tag(field, 2) + varint(len(bad)) + bad
        yield "truncated-varint", tag(field, 0) + b"\xff\xff"
        yield "length-past-end", tag(field, 2) + varint(1000) + b"abc"
    yield "truncated-tag", b"\x80"
    yield "wire-type-7", b"\x0f"


def hostile_strings(rng: random.Random) -> list[str]:
    return [
        "",
        " ",
        "\t\n\r",
        "a\x00b",
        "\x1b[31mred\x1b[0m",
        "\u200b\u200d\ufeff\u2028\u2029\u202e",
        "\U000e0041\U000e007f",
        "Zo\u00eb iso-\u00e1 \u4f60\u597d \U0001f600",
        "-",
        "../../etc/passwd",
        "' OR 1=1 --",
        "%s%n{0}${x}",
        "x" * 129,
        "p" * 257,
        "y" * 5000,
        "z" * 70_000,
        "".join(chr(rng.randrange(0x20, 0x3000)) for _ in range(300)),
    ]


INTS = (-1, -(2**31), 2**31 - 1, 2**63 - 1, -(2**63), 0, 7)


def hostile_message(
    cls: type[message.Message], rng: random.Random, strings: list[str]
) -> message.Message:
    """A well-formed `cls` with a hostile value in every field."""
    msg = cls()
    for field in cls.DESCRIPTOR.fields:
        repeated = field.is_repeated
        value = hostile_value(field, rng, strings)
        if value is None:
            continue
        if field.type == FieldDescriptor.TYPE_MESSAGE:
            target = getattr(msg, field.name)
            if repeated:
                target.add().CopyFrom(value)
            else:
                target.CopyFrom(value)
        elif repeated:
            getattr(msg, field.name).extend([value, value])
        else:
            setattr(msg, field.name, value)
    return msg


def hostile_value(field: Field, rng: random.Random, strings: list[str]) -> object:
    kind = field.type
    if kind == FieldDescriptor.TYPE_STRING:
        return rng.choice(strings)
    if kind == FieldDescriptor.TYPE_BYTES:
        return rng.randbytes(rng.randrange(0, 40))
    if kind == FieldDescriptor.TYPE_BOOL:
        return rng.random() < 0.5
    if kind == FieldDescriptor.TYPE_ENUM:
        return rng.choice([0, 1, 2, 99, -5, 2**31 - 1])
    if kind in (FieldDescriptor.TYPE_DOUBLE, FieldDescriptor.TYPE_FLOAT):
        return rng.choice([float("nan"), float("inf"), -1e308, 0.0])
    if kind == FieldDescriptor.TYPE_MESSAGE:
        assert field.message_type is not None  # a message field always has its type
        # protobuf's stubs type the upb descriptor apart from the Python one it stands for.
        sub = message_factory.GetMessageClass(field.message_type)  # type: ignore[arg-type]
        if field.message_type.full_name == "google.protobuf.Timestamp":
            seconds = rng.choice([-(2**40), -62135596801, 0, 253402300800, 2**40])
            nanos = rng.choice([0, -1, 10**9, 999_999_999])
            return sub(seconds=seconds, nanos=nanos)
        if field.message_type.fields:
            return hostile_message(sub, rng, strings)
        return sub()
    if kind == FieldDescriptor.TYPE_UINT32 or kind == FieldDescriptor.TYPE_FIXED32:
        return rng.choice([0, 2**32 - 1])
    if kind == FieldDescriptor.TYPE_UINT64 or kind == FieldDescriptor.TYPE_FIXED64:
        return rng.choice([0, 2**64 - 1])
    if kind in (
        FieldDescriptor.TYPE_INT32,
        FieldDescriptor.TYPE_SINT32,
        FieldDescriptor.TYPE_SFIXED32,
    ):
        return rng.choice([v for v in INTS if -(2**31) <= v < 2**31])
    return rng.choice(INTS)


def inputs(method: Method, rng: random.Random) -> Iterator[tuple[str, bytes]]:
    """(category, request bytes) for `method`: undecodable, random, cut and hostile."""
    yield from undecodable(method, rng)
    for _ in range(RANDOM_INPUTS_PER_METHOD):
        yield "random-bytes", rng.randbytes(rng.randrange(1, 64))
    strings = hostile_strings(rng)
    for _ in range(HOSTILE_MESSAGES_PER_METHOD):
        whole = hostile_message(method.request, rng, strings).SerializeToString()
        yield "hostile-fields", whole
        if len(whole) > 1:
            yield "cut-message", whole[: rng.randrange(1, len(whole))]
    yield "unknown-field", varint(999 << 3 | 0) + varint(5) + varint(998 << 3 | 2) + b"\x01x"
    yield "empty", b""


# --- the run --------------------------------------------------------------------------------


def identities(api: Api) -> list[tuple[str, Metadata]]:
    return [
        ("valid", api.who("fuzz")),
        ("admin", api.who("fuzz-admin", roles="memoria-admin")),
        ("none", ()),
        ("blank-tenant", (("x-memoria-tenant", "   "), ("x-memoria-principal", "fuzz"))),
        ("long-principal", api.who("p" * 300)),
    ]


@dataclass
class Outcome:
    code: grpc.StatusCode
    reason: str


def call(channel: grpc.Channel, method: Method, body: bytes, md: Metadata) -> Outcome:
    """Send `body` as the request of `method`, exactly as bytes; the status it answers."""
    try:
        if method.kind == "unary_unary":
            channel.unary_unary(method.path, None, None)(body, metadata=md, timeout=10)
        elif method.kind == "unary_stream":
            responses = channel.unary_stream(method.path, None, None)(body, metadata=md, timeout=10)
            # Watch streams forever: its first answer is the one that counts. (The call is its
            # own iterator; grpc's stub declares only __iter__, and cancel without types.)
            next(iter(responses))
            responses.cancel()  # type: ignore[no-untyped-call]
        else:
            for _ in channel.stream_stream(method.path, None, None)(
                iter([body]), metadata=md, timeout=10
            ):
                pass
    except grpc.RpcError as error:
        assert isinstance(error, grpc.Call)
        code = error.code()
        if code in NEVER:
            return Outcome(code, error.details() or "")
        if method.path == HEALTH_CHECK and code is grpc.StatusCode.NOT_FOUND:
            return Outcome(code, "(grpc health: unknown service)")
        info = error_info(error)
        assert info.domain == "memoria.v1"
        reason = ErrorReason[info.reason.removeprefix("ERROR_REASON_")]
        error_reason_pb2.ErrorReason.Value(info.reason)  # in the contract
        assert STATUS_OF[reason] is code, (method.path, info.reason, code)
        return Outcome(code, info.reason)
    return Outcome(grpc.StatusCode.OK, "")


@pytest.fixture
def fuzz_api(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Api]:
    """One embedded server (SQLite): the inputs exercise decoding and validation, which do
    not depend on the engine."""
    with serving(server_settings("sqlite", request, tmp_path)) as api:
        yield api


def test_every_malformed_random_or_hostile_request_gets_a_clear_status(
    fuzz_api: Api, caplog: pytest.LogCaptureFixture, capsys: pytest.CaptureFixture[str]
) -> None:
    rng = random.Random(SEED)
    started = time.monotonic()
    tally: collections.Counter[tuple[str, str, str]] = collections.Counter()
    failures: list[str] = []
    tried = 0
    with caplog.at_level(logging.INFO):
        for method in METHODS:
            for category, body in inputs(method, rng):
                for who, md in identities(fuzz_api):
                    if who != "valid" and category not in ("hostile-fields", "invalid-utf8"):
                        continue  # the identity matters only where the body gets that far
                    if not method.memoria and who != "valid":
                        continue  # health and reflection ignore identity
                    tried += 1
                    outcome = call(fuzz_api.channel, method, body, md)
                    group = "memoria" if method.memoria else method.path.split("/")[1]
                    tally[(group, category, f"{outcome.code.name} {outcome.reason}")] += 1
                    if outcome.code in NEVER:
                        failures.append(f"{method.path} {category} {who}: {outcome}")
                    must_be_malformed = category in (
                        "invalid-utf8",
                        "truncated-varint",
                        "length-past-end",
                        "truncated-tag",
                        "wire-type-7",
                    )
                    authenticated = who in ("valid", "admin") or not method.memoria
                    if must_be_malformed and authenticated:
                        expected = ("INVALID_ARGUMENT", "ERROR_REASON_MALFORMED_REQUEST")
                        if (outcome.code.name, outcome.reason) != expected:
                            failures.append(f"{method.path} {category} {who}: {outcome}")
                    refused = outcome.code is grpc.StatusCode.UNAUTHENTICATED
                    if must_be_malformed and not authenticated and not refused:
                        failures.append(f"{method.path} {category} {who}: {outcome}")
            assert time.monotonic() - started < TIME_BUDGET_S, "the fuzz run took too long"
    elapsed = time.monotonic() - started
    health = health_pb2.HealthCheckResponse.FromString(
        fuzz_api.channel.unary_unary(HEALTH_CHECK, None, None)(
            health_pb2.HealthCheckRequest().SerializeToString(), timeout=10
        )
    )
    with capsys.disabled():
        print(summary(tried, elapsed, tally))
    assert failures == []
    assert health.status == health_pb2.HealthCheckResponse.SERVING
    assert tried >= 500
    tracebacks = [r.getMessage() for r in caplog.records if r.exc_info]
    assert tracebacks == []
    assert not [r for r in caplog.records if "deserializ" in r.getMessage().lower()]
    malformed_lines = [r for r in caplog.records if r.name == "server.rpc.interceptor"]
    assert 1 <= len(malformed_lines) <= 2  # rate-limited: one line per minute


def summary(tried: int, elapsed: float, tally: collections.Counter[tuple[str, str, str]]) -> str:
    by_status: collections.Counter[str] = collections.Counter()
    for (_, _, status), count in tally.items():
        by_status[status] += count
    lines = [
        "",
        f"fuzz: {tried} requests in {elapsed:.1f} s over {len(METHODS)} methods (seed {SEED})",
        "  by status: "
        + ", ".join(f"{status.strip()} x{count}" for status, count in by_status.most_common()),
    ]
    by_category: dict[str, collections.Counter[str]] = collections.defaultdict(collections.Counter)
    for (group, category, status), count in sorted(tally.items()):
        by_category[f"{group}/{category}"][status.strip()] += count
    for key, statuses in by_category.items():
        lines.append(f"  {key}: " + ", ".join(f"{s} x{n}" for s, n in statuses.most_common()))
    return "\n".join(lines)
