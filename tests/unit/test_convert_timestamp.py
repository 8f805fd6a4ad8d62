"""Times on the wire: `convert.timestamp` gives what protobuf's own conversion gives."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta, timezone

from google.protobuf.timestamp_pb2 import Timestamp
from hypothesis import given
from hypothesis import strategies as st

from server.rpc.convert import timestamp

OFFSETS = st.builds(
    timezone,
    st.timedeltas(
        min_value=timedelta(hours=-23, minutes=-59), max_value=timedelta(hours=23, minutes=59)
    ),
)
TIMES = st.datetimes(
    min_value=datetime(2, 1, 1), max_value=datetime(9998, 12, 31), timezones=OFFSETS
)


def reference(value: datetime) -> Timestamp:
    ts = Timestamp()
    ts.FromDatetime(value.astimezone(UTC))
    return ts


@given(TIMES)
def test_an_aware_time_converts_as_protobuf_converts_it(value: datetime) -> None:
    assert timestamp(value) == reference(value)


@given(st.datetimes(min_value=datetime(1900, 1, 2), max_value=datetime(9998, 12, 31)))
def test_a_naive_time_is_taken_as_local_as_astimezone_takes_it(value: datetime) -> None:
    assert timestamp(value) == reference(value)


def test_before_1970_nanos_stay_positive() -> None:
    ts = timestamp(datetime(1969, 12, 31, 23, 59, 59, 500_000, tzinfo=UTC))
    assert ts is not None
    assert (ts.seconds, ts.nanos) == (-1, 500_000_000)


def test_none_is_no_time() -> None:
    assert timestamp(None) is None
