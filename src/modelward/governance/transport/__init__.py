"""Transports of the party protocol: the gRPC + mutual TLS server and client, the in-process client, and the
launcher of party processes. Bytes in, bytes out; the policy lives in :mod:`modelward.governance.party.gate`."""
