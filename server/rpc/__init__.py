"""Transport: gRPC servicers, message conversion, the error-to-status table, authentication."""
