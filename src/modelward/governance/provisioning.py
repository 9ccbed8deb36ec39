"""Provision a consortium in one step: one signed start-up kit per party (``modelward party provision``).

``CONSORTIUM.toml`` lists the model, the parties in chain order (the data owner first, the label holder last) and
the driver's control identity, and for each party where it listens, its layers, its data, its policy and its
identity, which is one of:

- ``cert = "bob.pem"``: the certificate the party made on its own host (``modelward party keygen bob``); its
  private key never leaves that host (the default, documented flow: the kit's ``tls.key`` names where the key is
  on the party's host, ``key = "../keys/bob.key"`` by default, relative to the kit);
- ``csr = "bob.csr"``: the party's certificate signing request, signed here by the consortium CA (``ca``, from
  ``modelward party ca init``); the key again stays on the party's host;
- ``generate = true``: DEV/TEST ONLY, the provisioner makes the party's key and puts it in the kit (the kit is
  then a secret, and the manifest and the output say so).

:func:`provision` writes, per party, ``KITS/<name>/``: ``party.toml`` (or, for the driver, ``split.toml``) with
the peers pinned by fingerprint, ``policy.toml``, the party's certificate, the peers' certificates
(``peers/*.pem``), the TLS trust bundle ``ca.pem``, the consortium deny-list ``revoked.txt``, ``start.sh`` and
``README.md``, and the signed manifest (:mod:`modelward.governance.trust.manifest`). The consortium signing key
(Ed25519) stays with the provisioner; its fingerprint goes to every party out of band.

:func:`open_party_kit` is what ``modelward party serve KIT`` does before anything in a kit is used: verify it
against the expected consortium key, check that the private key on this host belongs to the kit's certificate,
refuse a kit older than one this host has accepted (its consortium version, :mod:`~.trust.versions`) and seed the
party's own deny-list with the consortium's. ``modelward party start KIT`` (:mod:`~.trust.start`) verifies the
whole kit, ``start.sh`` included, and runs that script from the very bytes that were checked.

Example:
    >>> res = provision("consortium.toml", "kits")  # doctest: +SKIP
    >>> res.key_fingerprint, sorted(res.kits)  # doctest: +SKIP
    ('spki-sha256:…', ['alice', 'bob', 'operator'])
"""

from __future__ import annotations

import ipaddress
import os
import re
import secrets
import shutil
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Literal

from cryptography import x509
from cryptography.hazmat.primitives import serialization
from pydantic import Field, field_validator, model_validator

from modelward.core.config import StrictModel, load_config, to_toml, validate
from modelward.core.train import TrainConfig
from modelward.core.zoo import ModelConfig, build_model
from modelward.errors import ConfigError
from modelward.governance.consent import Policy
from modelward.governance.driver.config import SplitConfig
from modelward.governance.party.config import (
    InitConfig,
    PartyConfig,
    PartyData,
    load_party_config,
    revoked_path,
)
from modelward.governance.plan import model_layers
from modelward.governance.trust.certs import ca_sign, check_name, keygen, read_pem
from modelward.governance.trust.identity import cert_fingerprint, normalize_fingerprint
from modelward.governance.trust.manifest import (
    ENV_KEY,
    KitError,
    KitManifest,
    key_fingerprint,
    load_or_create_signing_key,
    verify_kit,
    write_manifest,
)
from modelward.governance.trust.revocation import read_deny_list, revoke
from modelward.governance.trust.start import KIT_DIR_ENV
from modelward.governance.trust.versions import check_kit_version

Role = Literal["inputs", "middle", "labels", "driver"]
CONSORTIUM_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")
# keys of PARTY.toml / SPLIT.toml that the provisioner sets itself (a `settings` table may not change them)
_PARTY_OWN = {"name", "host", "port", "layers", "input_shape", "num_classes", "model", "init", "data", "tls", "peers",
              "prev", "next", "driver", "policy", "policy_file", "checkpoint_dir", "audit_db", "revoked_file",
              "address_file"}
_SPLIT_OWN = {"parties", "tls", "train", "seed", "out_dir", "revoked_file", "session"}


class ConsortiumParty(StrictModel):
    """One ``[[parties]]`` entry of CONSORTIUM.toml (see the module docstring).

    Args:
        name: the party's name; role: ``inputs`` (first: the inputs), ``middle``, ``labels`` (last: the labels)
            or ``driver`` (the control identity: no server, its kit holds ``split.toml``).
        address: ``host:port`` where the others reach it (not for the driver); listen: the host its server binds
            (default: the address's host if it is an IP address, else ``0.0.0.0``).
        layers: its contiguous run of the model's layers; data: its data (inputs/labels parties; paths are on its
            own host, relative to its kit); policy / policy_file: its consent policy.
        cert / csr / generate: its identity (exactly one); key: where its private key is on its own host, as its
            kit's config names it (default ``../keys/<name>.key``; not with ``generate``); hosts: extra host names
            for a generated certificate.
        state_dir: where its checkpoints, audit log and deny-list go (default ``../<name>-state``, relative to the
            kit: outside it, so the kit stays as signed); settings: further PARTY.toml (or SPLIT.toml) keys.
    """

    name: str
    role: Role
    address: str | None = None
    listen: str | None = None
    layers: list[str] = Field(default_factory=list)
    data: PartyData | None = None
    policy: Policy | None = None
    policy_file: str | None = None
    cert: str | None = None
    csr: str | None = None
    generate: bool = False
    key: str | None = None
    hosts: list[str] = Field(default_factory=list)
    state_dir: str | None = None
    settings: dict[str, Any] = Field(default_factory=dict)

    @field_validator("name")
    @classmethod
    def _name(cls, v: str) -> str:
        return check_name(v)

    @model_validator(mode="after")
    def _fields(self) -> ConsortiumParty:
        n = self.name
        if sum([self.cert is not None, self.csr is not None, self.generate]) != 1:
            raise ValueError(f"party {n}: give exactly one identity: cert = \"{n}.pem\" (made on its host by "
                             f"`modelward party keygen {n}`), csr = \"{n}.csr\" (signed by the consortium ca), or "
                             "generate = true (dev/test only: the key is made here and put in the kit)")
        if self.generate and self.key is not None:
            raise ValueError(f"party {n}: key names the party's own key on its host; with generate = true the key "
                             "is made here and put in the kit")
        if self.role == "driver":
            extra = [f for f in ("address", "listen", "data", "policy", "policy_file") if getattr(self, f)]
            if extra or self.layers:
                raise ValueError(f"party {n}: the driver has no server, layers, data or policy; remove "
                                 f"{extra + (['layers'] if self.layers else [])}")
            return self
        if self.address is None:
            raise ValueError(f"party {n}: address is missing: the host:port where the others reach it, e.g. "
                             "\"b.example.org:50062\"")
        host, _, port = self.address.rpartition(":")
        if not host or not port.isdigit() or not 0 < int(port) < 65536:
            raise ValueError(f"party {n}: address {self.address!r}: expected host:port with a port in 1..65535")
        if not self.layers:
            raise ValueError(f"party {n}: layers is empty; give its contiguous run of the model's layers")
        if (self.policy is None) == (self.policy_file is None):
            raise ValueError(f"party {n}: give its consent policy as [parties.policy] or policy_file (one of them)")
        if self.role in ("inputs", "labels") and self.data is None:
            raise ValueError(f"party {n}: role {self.role!r} needs its data ([parties.data] file or dataset, on "
                             "its own host)")
        if self.role == "middle" and self.data is not None:
            raise ValueError(f"party {n}: a middle party holds no data; remove [parties.data]")
        return self

    @property
    def host(self) -> str:
        return (self.address or "").rpartition(":")[0].strip("[]")

    @property
    def port(self) -> int:
        return int((self.address or ":0").rpartition(":")[2])

    def listen_host(self) -> str:
        if self.listen:
            return self.listen
        try:
            ipaddress.ip_address(self.host)
            return self.host
        except ValueError:
            return "0.0.0.0"


class ConsortiumConfig(StrictModel):
    """``CONSORTIUM.toml``: the model, the parties in chain order and the driver, the consortium CA and key.

    Args:
        name: the consortium's name (in every manifest).
        model / input_shape / num_classes / init: the agreed model (every party builds its own segment).
        parties: the data owner first, middle parties, the label holder last (chain order), and one ``driver``.
        ca: the consortium CA folder (``modelward party ca init``) that signs CSRs; signing_key: the Ed25519 key
            that signs the manifests (created with mode 0600 if absent; stays here).
        revoked: fingerprints every kit's deny-list starts with.
        train / seed / split: the driver's training procedure, data order and further SPLIT.toml keys.
        version: the consortium version these kits carry (default: one more than the last provisioning with this
            signing key, kept beside it in ``<signing_key>.version``); it must exceed that one.

    Example:
        >>> c = ConsortiumConfig(name="digits", input_shape=[1, 8, 8], num_classes=10, parties=[
        ...     {"name": "alice", "role": "inputs", "address": "a:1", "layers": ["conv1"], "generate": True,
        ...      "policy": {}, "data": {"dataset": {"source": "digits"}}},
        ...     {"name": "bob", "role": "labels", "address": "b:2", "layers": ["conv2", "fc1", "logits"],
        ...      "generate": True, "policy": {}, "data": {"dataset": {"source": "digits"}}},
        ...     {"name": "operator", "role": "driver", "generate": True}])
        >>> [p.name for p in c.chain], c.driver.name
        (['alice', 'bob'], 'operator')
    """

    name: str
    model: ModelConfig = Field(default_factory=ModelConfig)
    input_shape: list[int]
    num_classes: int = Field(ge=2)
    init: InitConfig = Field(default_factory=InitConfig)
    parties: list[ConsortiumParty]
    ca: str | None = None
    signing_key: str = "consortium-signing.key"
    revoked: list[str] = Field(default_factory=list)
    train: TrainConfig = Field(default_factory=TrainConfig)
    seed: int = 0
    split: dict[str, Any] = Field(default_factory=dict)
    version: int | None = Field(None, ge=1)

    @field_validator("name")
    @classmethod
    def _cname(cls, v: str) -> str:
        if not CONSORTIUM_RE.match(v):
            raise ValueError(f"got {v!r}; use 1-64 letters, digits, '.', '_' or '-', starting with a letter or digit")
        return v

    @field_validator("revoked")
    @classmethod
    def _revoked(cls, v: list[str]) -> list[str]:
        return [normalize_fingerprint(fp, f"revoked[{i}]") for i, fp in enumerate(v)]

    @model_validator(mode="after")
    def _chain(self) -> ConsortiumConfig:
        names = [p.name for p in self.parties]
        if len(set(names)) != len(names):
            raise ValueError(f"parties: names must be distinct, got {names}")
        drivers = [p.name for p in self.parties if p.role == "driver"]
        if len(drivers) != 1:
            raise ValueError(f"parties: exactly one party has role = \"driver\" (the control identity), got "
                             f"{drivers or 'none'}")
        chain = [p for p in self.parties if p.role != "driver"]
        roles = [p.role for p in chain]
        if len(chain) < 2 or roles[0] != "inputs" or roles[-1] != "labels" or "inputs" in roles[1:] \
                or "labels" in roles[:-1]:
            raise ValueError(f"parties: the chain (in the order listed) must be one role = \"inputs\" first, any "
                             f"\"middle\", one \"labels\" last; got {[f'{p.name}:{p.role}' for p in chain]}")
        if any(p.csr is not None for p in self.parties) and self.ca is None:
            raise ValueError("ca: a party gives a csr, so the consortium CA folder (`modelward party ca init`) must "
                             "be named to sign it")
        return self

    @property
    def chain(self) -> list[ConsortiumParty]:
        return [p for p in self.parties if p.role != "driver"]

    @property
    def driver(self) -> ConsortiumParty:
        return next(p for p in self.parties if p.role == "driver")


@dataclass
class ProvisionResult:
    """What :func:`provision` made: the kits, the consortium key's fingerprint, the dev-generated parties."""

    kits: dict[str, Path]
    key_fingerprint: str
    key_path: Path
    key_created: bool
    generated: list[str] = field(default_factory=list)  # parties whose key the provisioner made (dev/test)
    version: int = 0  # the consortium version the kits carry


def version_counter(signing_key: Path) -> Path:
    """Where the provisioner keeps the last consortium version it signed: beside the signing key."""
    return signing_key.with_name(signing_key.name + ".version")


def last_version(signing_key: Path) -> int:
    """The last consortium version provisioned with `signing_key` (0: none yet)."""
    p = version_counter(signing_key)
    if not p.exists():
        return 0
    text = p.read_text().strip()
    if not text.isdigit():
        raise ConfigError(f"{p}: expected the last consortium version (an integer), got {text[:40]!r}")
    return int(text)


def _rel(base: Path, p: str) -> Path:
    q = Path(p).expanduser()
    return q if q.is_absolute() else base / q


def _check_layers(cfg: ConsortiumConfig, source: str) -> None:
    """The parties' layers are the model's, contiguous, in chain order, each layer held once (a zoo model only:
    an entry-point model is code, not run here)."""
    if cfg.model.arch == "entrypoint":
        return

    names = [lay.name for lay in model_layers(build_model(cfg.model, tuple(cfg.input_shape), cfg.num_classes))]
    got = [lay for p in cfg.chain for lay in p.layers]
    if got != names:
        where = next((f"parties.{p.name}.layers" for p in cfg.chain if any(x not in names for x in p.layers)),
                     "parties.*.layers")
        raise ConfigError(f"{source}: {where}: the parties' layers, in chain order, must be the model's layers "
                          f"{names}, each once; got {[p.layers for p in cfg.chain]}")


def _identity(p: ConsortiumParty, cfg: ConsortiumConfig, base: Path, kit: Path, source: str) -> tuple[bytes, bool]:
    """Put the party's certificate in `kit` as ``<name>.pem`` (and, with generate, its key as ``<name>.key``)."""
    dest = kit / f"{p.name}.pem"
    if p.generate:
        hosts = [h for h in [p.host, *p.hosts] if h]
        paths = keygen(p.name, kit, hosts)
        paths["csr"].unlink()
        return paths["cert"].read_bytes(), True
    if p.csr is not None:
        ca_sign(_rel(base, cfg.ca or ""), _rel(base, p.csr), dest)
        pem = dest.read_bytes()
    else:
        pem = read_pem(_rel(base, p.cert or ""), f"parties.{p.name}.cert")
        dest.write_bytes(pem)
    try:
        cert = x509.load_pem_x509_certificate(pem)
    except ValueError as e:
        raise ConfigError(f"{source}: parties.{p.name}: not a certificate ({e})") from None
    cns = [str(a.value) for a in cert.subject.get_attributes_for_oid(x509.NameOID.COMMON_NAME)]
    if cns != [p.name]:
        raise ConfigError(f"{source}: parties.{p.name}: the certificate is made out to {cns}, not {p.name!r}; "
                          f"give the one `modelward party keygen {p.name}` made on its host")
    if cert.not_valid_after_utc <= datetime.now(UTC):
        raise ConfigError(f"{source}: parties.{p.name}: the certificate expired on {cert.not_valid_after_utc:%Y-%m-%d}; "
                          f"ask {p.name} for a new one (`modelward party keygen {p.name} --force` on its host)")
    return pem, False


def _self_signed(cert: x509.Certificate) -> bool:
    if cert.issuer != cert.subject:
        return False
    try:
        cert.verify_directly_issued_by(cert)
        return True
    except Exception:  # noqa: BLE001 - any failure (bad signature, unsupported key): not self-signed
        return False


def _bundle(peers: dict[str, bytes], ca_pem: bytes | None, source: str) -> bytes:
    """The TLS trust bundle for one kit: each self-signed peer certificate (cross-pinning) and, for peers the
    consortium CA signed, that CA."""
    out: list[bytes] = []
    ca = x509.load_pem_x509_certificate(ca_pem) if ca_pem else None
    need_ca = False
    for name, pem in peers.items():
        cert = x509.load_pem_x509_certificate(pem)
        if _self_signed(cert):
            out.append(pem if pem.endswith(b"\n") else pem + b"\n")
            continue
        try:
            if ca is None:
                raise ValueError("no consortium CA")
            cert.verify_directly_issued_by(ca)
        except Exception:  # noqa: BLE001 - whatever the reason, the peers could not verify it
            raise ConfigError(f"{source}: parties.{name}: its certificate is signed by {cert.issuer.rfc4514_string()}"
                              ", neither itself nor the consortium CA (ca); its peers could not verify it") from None
        need_ca = True
    if need_ca and ca_pem:
        out.insert(0, ca_pem if ca_pem.endswith(b"\n") else ca_pem + b"\n")
    return b"".join(out)


def _check_settings(p: ConsortiumParty, own: set[str], source: str) -> None:
    clash = sorted(set(p.settings) & own)
    if clash:
        raise ConfigError(f"{source}: parties.{p.name}.settings: {clash} are set by the provisioner from the "
                          "consortium file; change them there (settings takes the other PARTY.toml/SPLIT.toml keys)")


def _start_sh(p: ConsortiumParty, command: str) -> str:
    """The kit's start script: it verifies the whole kit (itself included, its version too) before it runs
    anything else, and stops at the first failure (``set -eu``). The documented way to run it is ``modelward
    party start KIT``, which verifies the script's own bytes before executing them: a script run directly is
    trusted as found."""
    return ("#!/bin/sh\n"
            f"# Start {p.name} from this kit: `modelward party start <this folder>` verifies the kit (signature, every\n"
            "# file's hash, this script included, and its consortium version) against the consortium key you got\n"
            "# out of band from the provisioner (never from this kit), then runs this script from the verified bytes.\n"
            f"# Set the key once on this host, e.g. export {ENV_KEY}=spki-sha256:...\n"
            "# Run directly (./start.sh), the first command below verifies the kit before anything else runs.\n"
            "set -eu\n"
            f'cd "${{{KIT_DIR_ENV}:-$(dirname "$0")}}"\n'
            f': "${{{ENV_KEY}:?set {ENV_KEY} to the consortium key fingerprint (checked out of band)}}"\n'
            f'modelward party verify-kit . --consortium-key "${ENV_KEY}" --party {p.name} --check-version\n'
            f"{command}\n")


def _readme(cfg: ConsortiumConfig, p: ConsortiumParty, files: list[str], dev: bool, key_in_kit: str,
            version: int) -> str:
    role = {"inputs": "the data owner (inputs, first layers)", "middle": "a middle party",
            "labels": "the label holder (labels, last layers, the loss)", "driver": "the driver (control role)"}
    lines = [f"# Start-up kit: {p.name} in consortium {cfg.name}", "",
             f"{p.name} is {role[p.role]}. Every file here is listed with its SHA-256 in MANIFEST.json, signed by "
             "the consortium key (MANIFEST.sig). Do not edit anything here: a changed, added or missing file makes "
             "the kit refuse to start. Ask the provisioner for a new kit instead.", ""]
    if dev:
        lines += ["**DEV/TEST KIT**: this party's private key was generated by the provisioner and is in this kit "
                  f"({key_in_kit}). Anyone who saw the kit can act as {p.name}. For real use, make the key on this "
                  f"host (`modelward party keygen {p.name} --out keys/`) and send only the certificate.", ""]
    else:
        lines += [f"The private key is not in the kit: it is the one made on this host by `modelward party keygen "
                  f"{p.name} --out keys/`, read from {key_in_kit} (relative to this folder).", ""]
    lines += ["## Start", "", "```sh", f"export {ENV_KEY}=spki-sha256:...   # from the provisioner, out of band",
              f"modelward party start path/to/this/kit --party {p.name}   # verifies everything, start.sh "
              "included, then runs it", "```", "",
              f"This kit is consortium version {version}: a host that has accepted a newer kit refuses it.", "",
              f"or `modelward party verify-kit . --consortium-key ${ENV_KEY} --party {p.name}` to only check it.",
              "", "## Files", "", *[f"- `{f}`" for f in files], ""]
    return "\n".join(lines)


def provision(path: str | Path, out: str | Path, force: bool = False) -> ProvisionResult:
    """Write one signed kit per party of CONSORTIUM.toml under `out` (``out/<name>/``).

    Args:
        path: the consortium file (relative paths in it are relative to its folder).
        out: the kits folder (created if needed).
        force: replace existing kits (otherwise an existing ``out/<name>`` is an error naming it).
    Returns:
        :class:`ProvisionResult`: the kits, the consortium key's fingerprint (to give every party out of band),
        whether the signing key was created now, and which parties got a provisioner-made key (dev/test).
    Example:
        >>> provision("examples/consortium_digits.toml", "runs/kits").key_fingerprint  # doctest: +SKIP
        'spki-sha256:…'
    """
    path = Path(path)
    cfg = load_config(path, ConsortiumConfig)
    source = str(path)
    base = path.resolve().parent
    out = Path(out).resolve()
    _check_layers(cfg, source)
    signing_path = _rel(base, cfg.signing_key)
    last = last_version(signing_path)
    version = cfg.version if cfg.version is not None else last + 1
    if version <= last:
        raise ConfigError(f"{source}: version: {version} is not above {last}, the last consortium version signed with "
                          f"{signing_path} ({version_counter(signing_path)}): parties that accepted those kits would refuse "
                          f"these; give a version above {last}, or leave it out")
    for p in cfg.parties:
        _check_settings(p, _SPLIT_OWN if p.role == "driver" else _PARTY_OWN, source)
        if (out / p.name).exists() and not force:
            raise ConfigError(f"{out / p.name} exists; refusing to overwrite a kit (pass --force to replace it)")
    key, created = load_or_create_signing_key(signing_path)
    out.mkdir(parents=True, exist_ok=True)
    stage = out / f".provision-{secrets.token_hex(4)}"
    stage.mkdir()
    try:
        certs: dict[str, bytes] = {}
        generated: list[str] = []
        for p in cfg.parties:
            (stage / p.name).mkdir()
            certs[p.name], dev = _identity(p, cfg, base, stage / p.name, source)
            if dev:
                generated.append(p.name)
        ca_pem = (_rel(base, cfg.ca) / "ca.pem").read_bytes() if cfg.ca else None
        deny = "".join(f"{fp}  # consortium {cfg.name}\n" for fp in cfg.revoked)
        chain = cfg.chain
        for p in cfg.parties:
            kit = stage / p.name
            if p.role == "driver":
                peers = [q.name for q in chain]
            else:
                j = chain.index(p)
                peers = [q.name for q in (chain[j - 1] if j else None, chain[j + 1] if j + 1 < len(chain) else None)
                         if q is not None] + [cfg.driver.name]
            (kit / "peers").mkdir()
            for q in peers:
                (kit / "peers" / f"{q}.pem").write_bytes(certs[q])
            (kit / "ca.pem").write_bytes(_bundle({q: certs[q] for q in peers}, ca_pem, source))
            (kit / "revoked.txt").write_text(deny or f"# consortium {cfg.name}: no revoked certificate\n")
            state = p.state_dir or f"../{p.name}-state"
            key_path = f"{p.name}.key" if p.generate else (p.key or f"../keys/{p.name}.key")
            tls = {"ca": "ca.pem", "cert": f"{p.name}.pem", "key": key_path}
            pins = {q: cert_fingerprint(certs[q]) for q in peers}
            if p.role == "driver":
                split = {"parties": [{"name": q.name, "address": q.address, "fingerprint": pins[q.name]}
                                     for q in chain],
                         "tls": tls, "train": cfg.train.model_dump(mode="json", exclude_none=True), "seed": cfg.seed,
                         "out_dir": f"{state}/split", "revoked_file": f"{state}/revoked.txt", **p.settings}
                validate(SplitConfig, split, f"{source}: parties.{p.name} (its split.toml)")
                (kit / "split.toml").write_text(to_toml(split))
                command = f'exec modelward split train split.toml --consortium-key "${ENV_KEY}" "$@"'
            else:
                j = chain.index(p)
                policy = p.policy if p.policy is not None else load_config(_rel(base, p.policy_file or ""), Policy)
                unknown = [q for q in policy.allow_peers if q not in pins]
                if unknown:
                    raise ConfigError(f"{source}: parties.{p.name}.policy.allow_peers: {unknown} are not its peers "
                                      f"(its peers: {sorted(pins)})")
                (kit / "policy.toml").write_text(to_toml(policy.model_dump(mode="json", exclude_none=True)))
                party: dict[str, Any] = {
                    "name": p.name, "host": p.listen_host(), "port": p.port, "layers": p.layers,
                    "input_shape": cfg.input_shape, "num_classes": cfg.num_classes,
                    "model": cfg.model.model_dump(mode="json", exclude_none=True),
                    "init": cfg.init.model_dump(mode="json", exclude_none=True), "tls": tls,
                    "peers": {q: {"fingerprint": pins[q]} for q in peers}, "driver": cfg.driver.name,
                    "policy_file": "policy.toml", "checkpoint_dir": f"{state}/checkpoints",
                    "audit_db": f"{state}/audit.db", "revoked_file": f"{state}/revoked.txt", **p.settings}
                if j:
                    party["prev"] = chain[j - 1].name
                if j + 1 < len(chain):
                    party["next"] = chain[j + 1].name
                    party["peers"][chain[j + 1].name]["address"] = chain[j + 1].address
                if p.data is not None:
                    party["data"] = p.data.model_dump(mode="json", exclude_none=True)
                validate(PartyConfig, party, f"{source}: parties.{p.name} (its party.toml)")
                (kit / "party.toml").write_text(to_toml(party))
                command = f'exec modelward party serve . --consortium-key "${ENV_KEY}" --party {p.name} "$@"'
            files = sorted([*(f.relative_to(kit).as_posix() for f in kit.rglob("*") if f.is_file()),
                            "README.md", "start.sh"])
            (kit / "README.md").write_text(_readme(cfg, p, files, p.generate, key_path, version))
            (kit / "start.sh").write_text(_start_sh(p, command))
            os.chmod(kit / "start.sh", 0o755)
            write_manifest(kit, key, consortium=cfg.name, party=p.name, role=p.role, dev_generated_key=p.generate,
                           version=version)
        kits: dict[str, Path] = {}
        for p in cfg.parties:
            dest = out / p.name
            if dest.exists():
                old = out / f".old-{p.name}-{secrets.token_hex(4)}"
                dest.rename(old)
                shutil.rmtree(old)
            (stage / p.name).rename(dest)
            kits[p.name] = dest
    finally:
        shutil.rmtree(stage, ignore_errors=True)
    counter = version_counter(signing_path)  # the next provisioning signs a higher version
    tmp = counter.with_name(counter.name + ".tmp")
    tmp.write_text(f"{version}\n")
    os.replace(tmp, counter)
    return ProvisionResult(kits, key_fingerprint(key.public_key()), signing_path, created, generated, version)


def open_party_kit(kit: str | Path, expected_key: str | None, party: str | None = None,
                   overrides: list[str] | None = None) -> tuple[Path, KitManifest]:
    """Everything ``party serve KIT`` checks before a kit is used; returns its ``party.toml`` and manifest.

    1. the kit verifies (:func:`~modelward.governance.trust.manifest.verify_kit`) against `expected_key`, given
       out of band (``--consortium-key`` or ``MODELWARD_CONSORTIUM_KEY``; without one the kit is refused);
    2. it is for `party` (when given) and its ``party.toml`` names the manifest's party;
    3. the private key its ``tls.key`` names (on this host) belongs to the kit's certificate: this host holds that
       party's key, so a kit of another party, replayed here, does not start;
    4. the consortium's deny-list (``revoked.txt``) is merged into the party's own (``revoked_file``, outside the
       kit, where ``party revoke`` adds to it).

    Args:
        kit: the kit folder; expected_key: ``spki-sha256:…`` or a public key file; party: this host's party.
        overrides: ``--set`` items: refused (the configuration is signed: change it in the consortium file).
    Returns:
        ``(party.toml path, verified manifest)``.
    Raises:
        KitError / ConfigError: one line naming what is wrong.
    """
    kit = Path(kit)
    if not expected_key:
        raise KitError(f"kit {kit}: give the consortium key to check it against (--consortium-key spki-sha256:… or "
                       f"{ENV_KEY}), as the provisioner told you out of band; a kit is never started unverified")
    if overrides:
        raise KitError(f"kit {kit}: --set {overrides[0]}: a kit's configuration is signed; change it in the "
                       "consortium file and provision again")
    m = verify_kit(kit, expected_key, party)
    if m.role == "driver" or not (kit / "party.toml").is_file():
        raise KitError(f"kit {kit}: this is the kit of {m.party!r} ({m.role}), which has no party.toml to serve; "
                       "run its start.sh (`modelward split train split.toml`)")
    cfg = load_party_config(kit / "party.toml")
    if cfg.name != m.party:
        raise KitError(f"kit {kit}: party.toml names {cfg.name!r} but the manifest is for {m.party!r}")
    cert = x509.load_pem_x509_certificate(read_pem(cfg.tls.cert, "tls.cert"))
    key_file = Path(cfg.tls.key)
    if not key_file.is_file():
        raise KitError(f"kit {kit}: tls.key {key_file} not found on this host: it must hold {m.party}'s own key "
                       f"(made here by `modelward party keygen {m.party}`); is this kit for this host?")
    try:
        key = serialization.load_pem_private_key(key_file.read_bytes(), password=None)
    except (ValueError, TypeError) as e:
        raise KitError(f"kit {kit}: tls.key {key_file}: not an unencrypted PEM private key ({e})") from None
    spki = serialization.PublicFormat.SubjectPublicKeyInfo
    if key.public_key().public_bytes(serialization.Encoding.DER, spki) != \
            cert.public_key().public_bytes(serialization.Encoding.DER, spki):
        raise KitError(f"kit {kit}: tls.key {key_file} does not belong to the kit's certificate {cfg.tls.cert} "
                       f"for {m.party!r}: this host's key is another party's (a kit of another party?)")
    check_kit_version(kit, m, record=True)  # an older kit than this host accepted is refused; else recorded
    deny = revoked_path(cfg)
    for fp, _note in read_deny_list(kit / "revoked.txt").items():
        deny.parent.mkdir(parents=True, exist_ok=True)
        revoke(deny, fp, f"consortium {m.consortium}")
    return kit / "party.toml", m
