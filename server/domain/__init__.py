"""The rules of the product, in pure Python: no grpc, SQLAlchemy or Qdrant imports here."""
