"""Shared governance by model splitting: split plans, party servers (gRPC + mutual TLS), consent, audit."""
