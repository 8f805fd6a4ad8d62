"""Memoria: a gRPC service that gives an LLM assistant a memory of each person it talks to."""
