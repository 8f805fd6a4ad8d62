"""Storage adapters: SQLAlchemy tables and repositories for SQLite and PostgreSQL, migrations."""
