"""The chunk index on Qdrant: the embedded engine and a server or cluster, one chunk layout."""
