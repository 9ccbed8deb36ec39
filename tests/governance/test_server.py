"""TLS-layer identity over real gRPC sockets on 127.0.0.1: trust bundles of two organisations' CAs, cross-pinned
self-signed keys, and a certificate named `alice` issued by Bob's CA that the handshake accepts but the pin refuses."""

from concurrent import futures

import grpc
import pytest

from modelward.errors import IdentityError
from modelward.governance.trust.certs import ca_init, ca_sign, keygen, make_certs
from modelward.governance.trust.identity import (
    cert_fingerprint,
    identify_peer,
    peer_pem_from_auth_context,
    public_key_fingerprint,
)


class PinnedEcho:
    """A gRPC server that, like a party, identifies its caller only by the pinned fingerprint."""

    def __init__(self, key: bytes, cert: bytes, roots: bytes, pins: dict[str, str]) -> None:
        self.refused: list[str] = []

        def call(req, ctx):
            try:
                return identify_peer(peer_pem_from_auth_context(ctx.auth_context()), pins).encode()
            except IdentityError as e:
                self.refused.append(str(e))
                ctx.abort(grpc.StatusCode.PERMISSION_DENIED, str(e))

        self.server = grpc.server(futures.ThreadPoolExecutor(2))
        h = grpc.method_handlers_generic_handler("t.T", {"C": grpc.unary_unary_rpc_method_handler(call)})
        self.server.add_generic_rpc_handlers((h,))
        creds = grpc.ssl_server_credentials([(key, cert)], root_certificates=roots, require_client_auth=True)
        self.port = self.server.add_secure_port("127.0.0.1:0", creds)
        self.server.start()

    def call(self, key: bytes, cert: bytes, roots: bytes, server_name: str) -> str:
        ch = grpc.secure_channel(f"127.0.0.1:{self.port}", grpc.ssl_channel_credentials(roots, key, cert),
                                 options=[("grpc.ssl_target_name_override", server_name)])
        try:
            return ch.unary_unary("/t.T/C")(b"", timeout=10).decode()
        except grpc.RpcError as e:
            return f"{e.code().name}: {e.details()}"
        finally:
            ch.close()


@pytest.fixture(scope="module")
def orgs(tmp_path_factory):
    root = tmp_path_factory.mktemp("orgs")
    make_certs(root / "a", ["alice"])           # organisation A's demo CA
    make_certs(root / "b", ["bob", "alice"])    # organisation B's CA also issues a certificate named alice
    return root, {k: (root / k).read_bytes() for k in ("a/ca.pem", "b/ca.pem", "a/alice.pem", "a/alice.key",
                                                       "b/alice.pem", "b/alice.key", "b/bob.pem", "b/bob.key")}


def test_two_org_bundle_works_and_bobs_alice_is_refused(orgs):
    _, f = orgs
    bundle = f["a/ca.pem"] + f["b/ca.pem"]
    pins = {"alice": cert_fingerprint(f["a/alice.pem"]), "bob": cert_fingerprint(f["b/bob.pem"])}
    srv = PinnedEcho(f["a/alice.key"], f["a/alice.pem"], bundle, pins)
    try:
        assert srv.call(f["b/bob.key"], f["b/bob.pem"], bundle, "alice") == "bob"  # CA B's cert via the bundle
        assert srv.call(f["a/alice.key"], f["a/alice.pem"], bundle, "alice") == "alice"
        out = srv.call(f["b/alice.key"], f["b/alice.pem"], bundle, "alice")
        assert out.startswith("PERMISSION_DENIED") and cert_fingerprint(f["b/alice.pem"]) in out
        assert len(srv.refused) == 1 and "common name 'alice'" in srv.refused[0]
    finally:
        srv.server.stop(None)


def test_cross_pinned_self_signed_and_consortium_csr(tmp_path):
    a, b = keygen("alice", tmp_path / "a"), keygen("bob", tmp_path / "b")
    r = {k: {n: p.read_bytes() for n, p in v.items()} for k, v in (("a", a), ("b", b))}
    # no CA: each side trusts exactly the other's self-signed certificate
    srv = PinnedEcho(r["a"]["key"], r["a"]["cert"], r["b"]["cert"], {"bob": cert_fingerprint(r["b"]["cert"])})
    try:
        assert srv.call(r["b"]["key"], r["b"]["cert"], r["a"]["cert"], "alice") == "bob"
        # a stranger's self-signed key is stopped by the handshake itself
        m = keygen("bob", tmp_path / "m")
        out = srv.call(m["key"].read_bytes(), m["cert"].read_bytes(), r["a"]["cert"], "alice")
        assert out.startswith("UNAVAILABLE")
    finally:
        srv.server.stop(None)
    # consortium CA: Bob's CSR signed; the pin is Bob's public key, so it holds across re-issue
    ca = ca_init(tmp_path / "ca", "Consortium")
    bob_signed = ca_sign(tmp_path / "ca", b["csr"]).read_bytes()
    srv = PinnedEcho(r["a"]["key"], r["a"]["cert"], ca["cert"].read_bytes(),
                     {"bob": public_key_fingerprint(r["b"]["key"])})
    try:
        assert srv.call(r["b"]["key"], bob_signed, r["a"]["cert"], "alice") == "bob"
    finally:
        srv.server.stop(None)


def test_tls_refusal_monitor_forwards_stderr_and_records_each_handshake_failure(capfd):
    import os
    import sys
    import time
    from types import SimpleNamespace

    from modelward.governance.transport.server import TLSRefusalMonitor

    recorded = []
    party = SimpleNamespace(audit=SimpleNamespace(refusal=lambda *a, **k: recorded.append(a)),
                            cfg=SimpleNamespace(audit_refusals_every_s=10.0))
    with TLSRefusalMonitor(party) as mon:
        os.write(2, b"I1122 ssl.cc:1] Handshake failed with error SSL_ERROR_SSL: CERTIFICATE_VERIFY_FAILED: x\n")
        print("an ordinary line", file=sys.stderr, flush=True)
        os.write(2, b"a line split Handshake fa")  # across two writes
        os.write(2, b"iled with error WRONG_VERSION_NUMBER\n")
        deadline = time.monotonic() + 5
        while mon.seen < 2 and time.monotonic() < deadline:
            time.sleep(0.01)
    assert mon.seen == 2 and len(recorded) == 2
    assert recorded[0][:2] == ("(unauthenticated TLS client)", "(tls handshake)")
    assert recorded[0][2].endswith("SSL_ERROR_SSL: CERTIFICATE_VERIFY_FAILED: x")
    assert recorded[1][2].endswith("WRONG_VERSION_NUMBER")
    err = capfd.readouterr().err  # everything still reaches the log, unchanged
    assert "an ordinary line" in err and err.count("Handshake failed") == 2
    print("after", file=sys.stderr, flush=True)  # standard error is restored
    assert "after" in capfd.readouterr().err
