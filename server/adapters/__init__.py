"""Adapters: one folder per thing adapted, each implementing ports of server/domain/ports.py.

- sql/: the relational store on SQLite or PostgreSQL (tables, repositories, the unit of work,
  the read cache, migrations).
- qdrant/: the chunk index, on the embedded engine (edge.py) and on a Qdrant server or cluster
  (server.py), under one chunk layout (layout.py).
- embedding/: dense embedders (MiniLM in-process, the optional e5, an external endpoint).
- secret_detector.py, disk.py: the small ones (credentials in text, free space on the data dir).
"""
