"""Dense embedders behind the domain's `Embedder` port."""
