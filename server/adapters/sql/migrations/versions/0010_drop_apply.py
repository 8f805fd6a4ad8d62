"""Drop `memoria_apply()`, the write function no server calls any more.

0009 replaced it by `memoria_write(...)` and kept it installed only for servers of the
previous version during a rolling upgrade. Every server now writes through `memoria_write`
(server/adapters/sql/unit_of_work.py); a function nobody calls is still one the service role
may execute, and one more body to keep in mind when the tables change.

The downgrade installs it again exactly as 0007 left it (announcing through
`memoria_announce`) and grants it to the service role, so servers of the version before 0009
can run on a database brought back to 0009.

Revision ID: 0010
Revises: 0009
Create Date: 2026-12-04
"""

from __future__ import annotations

import importlib

from alembic import op

revision = "0010"
down_revision = "0009"
branch_labels = None
depends_on = None

SIGNATURE = (
    "text, text, text, boolean, text, text, timestamptz, boolean, boolean, timestamptz, "
    "text, text, timestamptz, json, json, integer, integer, integer, boolean, text"
)


def upgrade(app_role: str | None = None) -> None:
    if op.get_bind().dialect.name != "postgresql":
        return
    op.execute(f"DROP FUNCTION memoria_apply({SIGNATURE})")


def downgrade(app_role: str | None = None) -> None:
    bind = op.get_bind()
    if bind.dialect.name != "postgresql":
        return
    # 0007's own text of the function, not a copy: the downgrade restores what 0007 installed.
    announce_migration = importlib.import_module(
        "server.adapters.sql.migrations.versions.0007_announce_to_others"
    )
    op.execute(announce_migration._apply_function("PERFORM memoria_announce(p_origin, v_key)"))
    op.execute(f"REVOKE ALL ON FUNCTION memoria_apply({SIGNATURE}) FROM PUBLIC")
    if app_role:
        role = bind.dialect.identifier_preparer.quote(app_role)
        op.execute(f"GRANT EXECUTE ON FUNCTION memoria_apply({SIGNATURE}) TO {role}")
