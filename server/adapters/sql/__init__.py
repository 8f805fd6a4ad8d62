"""The relational store on SQLite (embedded default) or PostgreSQL: blocks, settings, audit,
the turn queue, tombstones and the inspector's records, with their migrations."""
