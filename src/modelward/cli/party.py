"""`modelward party`: make keys and certificates for mutual TLS, pin them, and run a party server."""

# lazy-imports: commands import the library on call, so `modelward --help` and this group's --help stay fast
from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console

app = typer.Typer(no_args_is_help=True)
console = Console()


@app.command("certs")
def certs(
    out: Annotated[Path, typer.Option("--out", help="folder for ca.pem and <party>.pem/.key")],
    parties: Annotated[str, typer.Option("--parties", help="comma-separated party names, e.g. alice,bob")],
    hosts: Annotated[str, typer.Option("--hosts", help="extra host names / IPs for the certificates")] = "",
    days: Annotated[int, typer.Option("--days", help="validity in days")] = 365,
    force: Annotated[bool, typer.Option("--force", help="replace an existing CA and keys in --out")] = False,
) -> None:
    """Quick-start demo: a uniquely named CA and one certificate + key per party, all made here (one machine).

    Organisations on separate hosts use `party keygen` (and `party ca init` / `party ca sign`) instead.
    """
    from modelward.governance.trust.certs import make_certs

    names = [p.strip() for p in parties.split(",") if p.strip()]
    paths = make_certs(out, names, [h.strip() for h in hosts.split(",") if h.strip()], days,
                       if_exists="overwrite" if force else "error")
    console.print(f"CA {_show(paths['ca'])} ({_subject(paths['ca'])}); certificates for {', '.join(names)} in "
                  f"{_show(out)} (keys are mode 0600)")


def _show(p: Path) -> str:
    return str(Path(p).resolve())


def _subject(cert: Path) -> str:
    from cryptography import x509

    return x509.load_pem_x509_certificate(Path(cert).read_bytes()).subject.rfc4514_string()


@app.command("keygen")
def keygen(
    name: Annotated[str, typer.Argument(help="this party's name, e.g. alice")],
    out: Annotated[Path, typer.Option("--out", help="folder for NAME.key (0600), NAME.pem, NAME.csr")],
    hosts: Annotated[str, typer.Option("--hosts", help="host names / IPs this party serves on")] = "",
    days: Annotated[int, typer.Option("--days", help="validity of the self-signed certificate")] = 365,
    force: Annotated[bool, typer.Option("--force", help="replace an existing key (peers must re-pin)")] = False,
) -> None:
    """Make this party's own private key on this host, a self-signed certificate (for cross-pinning) and a CSR."""
    from modelward.governance.trust.certs import keygen as run
    from modelward.governance.trust.identity import cert_fingerprint, public_key_fingerprint

    paths = run(name, out, [h.strip() for h in hosts.split(",") if h.strip()], days, force)
    cert = paths["cert"].read_bytes()
    # plain print, not rich: these lines are copied into configs and must not be wrapped
    print(f"key {_show(paths['key'])} (mode 0600; keep it on this host)")
    print(f"self-signed certificate {_show(paths['cert'])} (give it to peers that cross-pin)")
    print(f"CSR {_show(paths['csr'])} (for `modelward party ca sign` at a consortium CA)")
    print(f'peers pin: {name} = "{cert_fingerprint(cert)}"')
    print(f'  or the public key: {name} = "{public_key_fingerprint(cert)}"')


ca_app = typer.Typer(no_args_is_help=True, help="a consortium CA that signs parties' CSRs")
app.add_typer(ca_app, name="ca")


@ca_app.command("init")
def ca_init(
    out: Annotated[Path, typer.Option("--out", help="folder for ca.pem and ca.key (0600)")],
    name: Annotated[str, typer.Option("--name", help="organisation name; a random suffix makes the CA unique")],
    days: Annotated[int, typer.Option("--days", help="validity in days")] = 1825,
    force: Annotated[bool, typer.Option("--force", help="replace an existing CA in --out")] = False,
) -> None:
    """Create a CA with a unique subject name (refuses to replace an existing one without --force)."""
    from modelward.governance.trust.certs import ca_init as run

    paths = run(out, name, days, force)
    console.print(f"CA {_show(paths['cert'])} ({_subject(paths['cert'])}); key {_show(paths['key'])} (mode 0600)")


@ca_app.command("sign")
def ca_sign(
    csr: Annotated[Path, typer.Argument(help="a party's NAME.csr (from `party keygen`)")],
    ca: Annotated[Path, typer.Option("--ca", help="the CA folder (from `party ca init`)")],
    out: Annotated[Path | None, typer.Option("--out", help="certificate path (default NAME-signed.pem next to the CSR)")]
    = None,
    days: Annotated[int, typer.Option("--days", help="validity in days")] = 365,
    force: Annotated[bool, typer.Option("--force", help="replace an existing certificate file")] = False,
) -> None:
    """Sign a CSR: a leaf certificate for server and client use named after the CSR's party name."""
    from modelward.governance.trust.certs import ca_sign as run
    from modelward.governance.trust.identity import cert_fingerprint

    path = run(ca, csr, out, days, force)
    print(f"certificate {_show(path)}")
    print(f'peers pin: "{cert_fingerprint(path.read_bytes())}"')


@app.command("fingerprint")
def fingerprint(
    cert: Annotated[Path, typer.Argument(help="a certificate (PEM), e.g. bob.pem")],
) -> None:
    """Print what peers pin for this certificate: its sha256 fingerprint and its public key's."""
    from modelward.governance.trust.certs import read_pem
    from modelward.governance.trust.identity import cert_fingerprint, public_key_fingerprint

    data = read_pem(cert, "certificate")
    print(cert_fingerprint(data))
    print(public_key_fingerprint(data))


@app.command("revoke")
def revoke(
    name: Annotated[str, typer.Argument(help="the peer to revoke, e.g. alice")],
    config: Annotated[Path, typer.Argument(help="this party's PARTY.toml")],
) -> None:
    """Revoke peer NAME's certificate: its pin goes on this party's deny-list (revoked_file), checked on every
    request; a running party refuses NAME from its next request on, and audits each refusal."""
    from modelward.governance.party.config import load_party_config, revoke_peer

    path, fp, added = revoke_peer(load_party_config(config), name)
    print(f"{'revoked' if added else 'already revoked'}: {name} {fp} (deny-list {path})")


@app.command("resume")
def resume(
    config: Annotated[Path, typer.Argument(help="this party's PARTY.toml")],
) -> None:
    """Lift a halt of the training: after this party's trend detector stopped a suspected poisoning (it refused
    the step, kept the evidence and rolled back to its last good checkpoint), and you have looked, let it train
    again. A running party notices at its next step and records the resume in its audit log; then rerun `split
    train`, which resumes from the latest checkpoint every party holds."""
    from modelward.governance.integrity import resume as lift
    from modelward.governance.party.config import load_party_config

    halt = lift(load_party_config(config).checkpoint_dir)
    print(f"resumed: {halt.party} had halted the training at step {halt.step} ({halt.reason})")
    print(f"  rolled back to step {halt.restored_step}; evidence and the checkpoints set aside: {halt.folder}")


@app.command("provision")
def provision(
    consortium: Annotated[Path, typer.Argument(help="CONSORTIUM.toml (the parties, their identities, the model)")],
    out: Annotated[Path, typer.Option("--out", help="folder for the kits: one sub-folder per party")],
    force: Annotated[bool, typer.Option("--force", help="replace existing kits in --out")] = False,
) -> None:
    """Write one signed start-up kit per party (config, pins, policy, peers' certificates, deny-list, start.sh).

    Each party's certificate comes from its own host (`party keygen` there; the key never leaves it) or its CSR
    (signed by the consortium CA); `generate = true` makes a key here, for dev/test only. The manifests are
    signed with the consortium key (created if absent, mode 0600, stays here): give its fingerprint to every
    party out of band.
    """
    from modelward.governance.provisioning import ENV_KEY
    from modelward.governance.provisioning import provision as run

    res = run(consortium, out, force)
    for name, kit in res.kits.items():
        dev = "  DEV/TEST: its private key was made here and is in the kit" if name in res.generated else ""
        print(f"kit {name}: {_show(kit)}{dev}")
    made = "created now" if res.key_created else "existing"
    print(f"consortium signing key {_show(res.key_path)} ({made}; mode 0600, keep it here)")
    print(f"consortium version {res.version}: a host that has accepted these kits refuses every older one")
    print(f"consortium key fingerprint: {res.key_fingerprint}")
    print(f"  give it to every party out of band (phone, signed e-mail) and check it there: {ENV_KEY}=<it> "
          "modelward party start KIT --party NAME, or `modelward party verify-kit KIT --consortium-key <it>`")
    if res.generated:
        print(f"WARNING: dev/test kits for {', '.join(res.generated)}: their private keys were generated here; "
              "for real use each party runs `modelward party keygen` on its own host and you give its cert or csr")


@app.command("verify-kit")
def verify_kit(
    kit: Annotated[Path, typer.Argument(help="a kit folder (from `party provision`)")],
    consortium_key: Annotated[str | None, typer.Option(
        "--consortium-key", help="the consortium key: spki-sha256:<hex> or its .pub file, obtained out of band "
        "(default: $MODELWARD_CONSORTIUM_KEY)")] = None,
    party: Annotated[str | None, typer.Option(
        "--party", help="the party this host runs: a kit of another party is refused (default: $MODELWARD_PARTY)")]
    = None,
    check_version: Annotated[bool, typer.Option(
        "--check-version", help="also refuse a kit older than one this host has accepted (its consortium version "
        "against the marks in its state folder and beside its key; nothing is recorded)")] = False,
) -> None:
    """Check a kit: the manifest's signature against the consortium key and every file's hash (no extra, missing
    or changed file). Exit code 0 only if it verifies."""
    from modelward.governance.trust.manifest import KitError, expected_key_from_env, expected_party_from_env
    from modelward.governance.trust.manifest import verify_kit as run

    key = expected_key_from_env(consortium_key)
    if not key:
        raise KitError(f"kit {kit}: give --consortium-key spki-sha256:… (or MODELWARD_CONSORTIUM_KEY), as the "
                       "provisioner told you out of band")
    m = run(kit, key, expected_party_from_env(party))
    if check_version:
        from modelward.governance.trust.versions import check_kit_version

        check_kit_version(kit, m, record=False)
    dev = "; DEV/TEST kit: its private key was made by the provisioner" if m.dev_generated_key else ""
    print(f"kit OK: {m.party} ({m.role}) of consortium {m.consortium}, version {m.version}, created {m.created}, "
          f"{len(m.files)} files, signed by {_kit_key(m)}{dev}")


@app.command("start", context_settings={"allow_extra_args": True, "ignore_unknown_options": True})
def start(
    ctx: typer.Context,
    kit: Annotated[Path, typer.Argument(help="a kit folder (from `party provision`)")],
    consortium_key: Annotated[str | None, typer.Option(
        "--consortium-key", help="the consortium key: spki-sha256:<hex> or its .pub file, obtained out of band "
        "(default: $MODELWARD_CONSORTIUM_KEY)")] = None,
    party: Annotated[str | None, typer.Option(
        "--party", help="the party this host runs: a kit of another party is refused (default: $MODELWARD_PARTY)")]
    = None,
) -> None:
    """Start a kit the safe way: verify it completely (signature, every file, start.sh included, its consortium
    version), then run its start.sh from the verified bytes. Nothing in the kit runs before that; further
    arguments go to start.sh."""
    from modelward.governance.trust.manifest import expected_key_from_env, expected_party_from_env
    from modelward.governance.trust.start import start_kit

    code = start_kit(kit, expected_key_from_env(consortium_key), expected_party_from_env(party), list(ctx.args))
    raise typer.Exit(code)


def _kit_key(m) -> str:  # the fingerprint of the key that signed a verified manifest
    from cryptography.hazmat.primitives import serialization

    from modelward.governance.trust.manifest import key_fingerprint

    return key_fingerprint(serialization.load_pem_public_key(m.signing_key.encode()))


@app.command("rotate")
def rotate(
    config: Annotated[Path, typer.Argument(help="this party's PARTY.toml (its tls.key / tls.cert are replaced)")],
    ca: Annotated[Path | None, typer.Option("--ca", help="the consortium CA folder that signs the new "
                                                          "certificate (CA-signed setups)")] = None,
    days: Annotated[int, typer.Option("--days", help="validity of the new certificate")] = 365,
    stage: Annotated[bool, typer.Option("--stage", help="write the new pair next to the old (.next) and switch "
                                                        "later with --switch (cross-pinning)")] = False,
    switch: Annotated[bool, typer.Option("--switch", help="put a staged pair in place")] = False,
    csr: Annotated[bool, typer.Option("--csr", help="a CA whose key is elsewhere: stage the new key and write a "
                                                    "CSR carrying the statement for `party ca sign`")] = False,
    signed: Annotated[Path | None, typer.Option("--signed", help="with --switch: the certificate the CA signed "
                                                                 "from that CSR")] = None,
) -> None:
    """Rotate this party's key: a new key and certificate carrying a statement signed by the old key; the running
    party switches at its next handshake and its peers follow the statement (no re-pin)."""
    from modelward.governance.party.config import load_party_config
    from modelward.governance.trust.rotation import install_signed, rotate_keys, switch_staged

    cfg = load_party_config(config)
    if switch and signed is not None:
        pin = install_signed(cfg.tls.key, cfg.tls.cert, signed)
        print(f"switched: {cfg.tls.cert} is the CA-signed certificate {pin}; the running party takes it at its "
              "next handshake")
        return
    if csr:
        res = rotate_keys(cfg.name, cfg.tls.key, cfg.tls.cert, days=days, csr=True)
        print(f"rotation #{res.statement.sequence} of {cfg.name}: new key staged at {_show(res.key)} (mode 0600)")
        print(f"CSR {_show(res.csr)} (carries the statement): `modelward party ca sign {res.csr.name} --ca CA`, "
              f"then `modelward party rotate {config} --switch --signed NAME-signed.pem`")
        return
    if switch:
        switch_staged(cfg.tls.key, cfg.tls.cert)
        print(f"switched: {cfg.tls.cert} and {cfg.tls.key} now hold the staged pair (the running party takes it "
              "at its next handshake)")
        return
    res = rotate_keys(cfg.name, cfg.tls.key, cfg.tls.cert, ca_dir=ca, days=days, stage=stage)
    print(f"rotation #{res.statement.sequence} of {cfg.name}: {res.old_pin} -> {res.new_pin}")
    print(f"new key {_show(res.key)} (mode 0600), certificate {_show(res.cert)} (carries the statement)")
    print(f"statement {_show(res.statement_path)} (signed by the old key; not secret)")
    if stage:
        print("cross-pinning: give the statement file to every peer (`modelward party accept-rotation STATEMENT "
              f"PEER.toml`), then run `modelward party rotate {config} --switch`")


@app.command("accept-rotation")
def accept_rotation(
    statement: Annotated[Path, typer.Argument(help="a peer's NAME-rotation-<n>.json (from `party rotate`)")],
    config: Annotated[Path, typer.Argument(help="this party's PARTY.toml")],
) -> None:
    """Check a peer's rotation statement against this party's pins and put it in the party's inbox; the running
    party picks it up at its next handshake (it trusts the new certificate from then on, the old one retires)."""
    from modelward.governance.party.config import load_party_config, pins, revoked_path
    from modelward.governance.trust.revocation import DenyList
    from modelward.governance.trust.rotation import deliver_statement

    cfg = load_party_config(config)
    dest, party, seq = deliver_statement(statement, pins(cfg), cfg.checkpoint_dir, DenyList(revoked_path(cfg)))
    print(f"rotation #{seq} of {party} verified against this party's pin; delivered to {_show(dest)}")


@app.command("serve")
def serve(
    config: Annotated[Path, typer.Argument(help="PARTY.toml, or a kit folder (from `party provision`)")],
    set_: Annotated[list[str] | None, typer.Option("--set", help="override key=value (not for a kit)")] = None,
    consortium_key: Annotated[str | None, typer.Option(
        "--consortium-key", help="for a kit: the consortium key (spki-sha256:<hex> or its .pub file), obtained out "
        "of band (default: $MODELWARD_CONSORTIUM_KEY; when set, only verified kits are served)")] = None,
    party: Annotated[str | None, typer.Option(
        "--party", help="for a kit: the party this host runs (default: $MODELWARD_PARTY)")] = None,
) -> None:
    """Serve this party's segment over gRPC with mutual TLS until SIGTERM / Ctrl-C.

    A kit (a folder with MANIFEST.json) is verified first and does not start unless it verifies."""
    from modelward.governance.trust.manifest import (
        check_kit_of,
        expected_key_from_env,
        expected_party_from_env,
    )

    # before anything heavy is imported: a kit that does not verify is refused at once
    if check_kit_of(config, consortium_key, party, set_) is not None:
        from modelward.governance.provisioning import open_party_kit

        config, m = open_party_kit(config if config.is_dir() else config.parent, expected_key_from_env(consortium_key),
                                   expected_party_from_env(party), set_)
        print(f"kit verified: {m.party} ({m.role}) of consortium {m.consortium}, version {m.version}, created "
              f"{m.created}, {len(m.files)} files{'; DEV/TEST kit' if m.dev_generated_key else ''}", flush=True)

    from modelward.governance.party.config import load_party_config
    from modelward.governance.transport.server import serve as run

    cfg = load_party_config(config, set_)
    run(cfg, log=lambda s: print(s, flush=True))
    # state is saved and the audit log closed: skip the slow interpreter teardown of torch/grpc threads
    import os
    import sys

    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


if __name__ == "__main__":  # the launcher starts servers this way: lighter than importing every command group
    from modelward.cli._errors import run_app

    run_app(app, prog_name="modelward party")
