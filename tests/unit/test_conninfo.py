"""`libpq_conninfo`: the read cache's listener and the pooler check connect where the pools do,
also on SQLAlchemy's multi-host URL (the failover setup, docs/operations.md)."""

from __future__ import annotations

from psycopg.conninfo import conninfo_to_dict

from server.adapters.sql.engine import libpq_conninfo


def test_a_multi_host_url_keeps_every_host_its_port_and_the_session_attribute() -> None:
    url = (
        "postgresql+psycopg://memoria_app:s%40cret@/memoria"
        "?host=10.0.0.1:5432&host=10.0.0.2:5433&target_session_attrs=read-write"
    )
    assert conninfo_to_dict(libpq_conninfo(url)) == {
        "user": "memoria_app",
        "password": "s@cret",
        "dbname": "memoria",
        "host": "10.0.0.1,10.0.0.2",
        "port": "5432,5433",
        "target_session_attrs": "read-write",
    }


def test_a_single_host_url_keeps_its_host_port_and_options() -> None:
    url = "postgresql+psycopg://memoria_app:pw@db.internal:6432/memoria?sslmode=require"
    assert conninfo_to_dict(libpq_conninfo(url)) == {
        "user": "memoria_app",
        "password": "pw",
        "dbname": "memoria",
        "host": "db.internal",
        "port": "6432",
        "sslmode": "require",
    }
