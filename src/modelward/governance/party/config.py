"""``PARTY.toml``: who a party is, where it listens, what it holds, whom it trusts (pinned) and its neighbours.

A party's peers are pinned by certificate fingerprint (``[peers.<name>] fingerprint = "sha256:…"``, as printed by
``modelward party fingerprint CERT``) or by the peer's certificate file (``cert = "bob.pem"``, read at start-up
and pinned by its fingerprint). Names in ``prev``, ``next``, ``driver`` and ``policy.allow_peers`` must be pinned
peers; a certificate whose fingerprint matches no pin is refused, whatever its common name or CA.

Initial parameters come from the party's own secret randomness (the OS CSPRNG) or from its own checkpoint
(``init.checkpoint``). ``init.test_seed`` makes them reproducible from the config, which is what monolithic-
equivalence tests need and what no real deployment may do: it is refused unless the party listens on loopback.
"""

from __future__ import annotations

import ipaddress
from pathlib import Path
from typing import Literal

from pydantic import Field, field_validator, model_validator

from modelward.core.config import StrictModel, load_config
from modelward.core.data import DataConfig
from modelward.core.init import INIT_SCHEMES
from modelward.core.zoo import ModelConfig
from modelward.errors import ConfigError
from modelward.governance.consent import Policy
from modelward.governance.integrity import IntegrityConfig
from modelward.governance.party.input_protection import InputProtectionConfig
from modelward.governance.party.label_protection import LabelProtectionConfig
from modelward.governance.party.tensors import CompressionConfig
from modelward.governance.trust.certs import check_name, read_pem
from modelward.governance.trust.identity import cert_fingerprint, normalize_fingerprint
from modelward.governance.trust.revocation import revoke

LOOPBACK_NAMES = ("localhost",)


# the label holder's default (issue 26): Marvell at scale 4 brings the gradient attacks to chance for at most 0.33
# accuracy points on digits and breast cancer (docs/governance.md, "Label leakage"); opt out with method = "none"
DEFAULT_LABEL_PROTECTION = LabelProtectionConfig(method="marvell", scale=4.0)


def is_loopback(host: str) -> bool:
    """True for 127.0.0.0/8, ::1 and ``localhost``: the only hosts where test-only options are accepted."""
    if host in LOOPBACK_NAMES:
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


class TLSConfig(StrictModel):
    ca: str  # CA certificate(s) that sign the peers' certificates (PEM; may be a bundle of several CAs)
    cert: str  # this party's certificate
    key: str  # this party's private key


class InitConfig(StrictModel):
    """Where this party's initial parameters come from (never from anything another party can see)."""

    scheme: str = "glorot_uniform"  # drawn with a seed from the OS CSPRNG (secrets), never written anywhere
    checkpoint: str | None = None  # this party's own safetensors (only its own entries are read)
    test_seed: int | None = None  # TEST ONLY: public seed for monolithic equivalence; refused off loopback

    @field_validator("scheme")
    @classmethod
    def _scheme(cls, v: str) -> str:
        if v not in INIT_SCHEMES:
            raise ValueError(f"got {v!r}; valid choices: {list(INIT_SCHEMES)}")
        return v

    @model_validator(mode="after")
    def _one(self) -> InitConfig:
        if self.checkpoint is not None and self.test_seed is not None:
            raise ValueError("give init.checkpoint or init.test_seed, not both")
        return self


class PartyData(StrictModel):
    """This party's own data: the inputs (first party) or the labels (last party), aligned by sample index."""

    file: str | None = None  # safetensors with x_train/x_test (inputs) or y_train/y_test (labels)
    dataset: DataConfig | None = None  # or a modelward data source; the party keeps only its column

    @model_validator(mode="after")
    def _one(self) -> PartyData:
        if (self.file is None) == (self.dataset is None):
            raise ValueError("give exactly one of data.file (safetensors) or [data.dataset] (a data source)")
        return self


class PeerConfig(StrictModel):
    """A pinned peer: its certificate fingerprint (or its certificate file) and, for the next party, its address."""

    fingerprint: str | None = None  # "sha256:<hex of the certificate's DER>" or "spki-sha256:<hex>"
    cert: str | None = None  # or the peer's certificate (PEM), pinned by its fingerprint at start-up
    address: str | None = None  # host:port (the next party; otherwise the driver tells it when a session opens)

    @model_validator(mode="after")
    def _one(self) -> PeerConfig:
        if (self.fingerprint is None) == (self.cert is None):
            raise ValueError("give exactly one of fingerprint (sha256:…) or cert (the peer's certificate file)")
        return self


class PartyConfig(StrictModel):
    """``PARTY.toml``; see the module docstring and docs/governance.md.

    Args:
        name: this party's name (its certificate's identity); host / port: where it listens (port 0: a free one,
            written to ``address_file``).
        layers: the contiguous layers it owns; input_shape: the whole model's input shape (no batch);
            num_classes: the model's classes; model / init: the zoo model and where its initial parameters come from.
        data: the party's local data (the first party's inputs, the last party's labels).
        tls: its CA, certificate and key; peers: the pinned peers; prev / next: its neighbours in the chain;
            driver: the identity the driver uses.
        policy / policy_file: its consent :class:`~modelward.governance.consent.Policy` (inline or a TOML file).
        checkpoint_dir / checkpoint_every / keep_checkpoints: checkpointing; audit_db: its audit log.
        max_message_mb, max_batch, max_abs_input, max_abs_param, max_sessions_per_peer, audit_refusals_every_s:
            hard limits independent of the policy (the transport's receive limit is the smaller of
            ``max_message_mb`` and the largest message the party's rows and shapes allow).
        label_protection: the label holder's gradient perturbation (default Marvell, scale 4; ``method = "none"``
            opts out); compression: int8 / top-k compression of the activations it sends and the gradients it
            returns (:class:`~modelward.governance.party.tensors.CompressionConfig`, default none); integrity: bounded influence and the trend detector (:class:`~modelward.governance.integrity.IntegrityConfig`);
            input_protection: the first party's defence of its inputs against reconstruction by the next one
            (:class:`~modelward.governance.party.input_protection.InputProtectionConfig`: activation noise,
            NoPeek; default off);
            anchor_every_s: the bound on how long an audit record stays unanchored in a neighbour's log.
        threads / timeout_s: torch threads, and the time limit of a request to the next party.
        update_priority: ``"idle"`` (default) runs the late part of a step (weight gradients, optimizer step and
            check, after the answer) at the lowest CPU priority, where the OS has one (Linux ``SCHED_IDLE``), so
            that it never delays the step's critical path; a late part found starved by other work on the host
            switches this party to ``"normal"``.

    Returns:
        A strict config for :func:`~modelward.governance.transport.server.serve` (load files with :func:`load_party_config`).

    Example:
        >>> cfg = PartyConfig(name="alice", layers=["fc1"], input_shape=[4], num_classes=3, checkpoint_dir="ckpt",
        ...                   audit_db="audit.db", tls={"ca": "ca.pem", "cert": "alice.pem", "key": "alice.key"})
        >>> cfg.port, cfg.policy.training
        (0, False)
    """

    name: str
    host: str = "127.0.0.1"
    port: int = Field(0, ge=0, le=65535)  # 0 = pick a free port (printed at startup and written to address_file)
    address_file: str | None = None  # where to write "host:port" once listening (the driver can read it)
    layers: list[str]
    input_shape: list[int]  # the whole model's input shape (without batch), e.g. [1, 8, 8]
    num_classes: int = Field(ge=2)
    model: ModelConfig = Field(default_factory=ModelConfig)
    init: InitConfig = Field(default_factory=InitConfig)
    data: PartyData | None = None
    tls: TLSConfig
    peers: dict[str, PeerConfig] = Field(default_factory=dict)
    prev: str | None = None  # the party before this one in the chain (sends activations, gets gradients)
    next: str | None = None  # the party after this one (gets activations, returns gradients)
    driver: str | None = None  # the identity the driver uses (sessions, commits, batch indices for the first party)
    policy: Policy = Field(default_factory=Policy)
    policy_file: str | None = None  # a TOML file with the policy table's keys (instead of [policy])
    checkpoint_dir: str
    checkpoint_every: int = Field(10, ge=1)
    keep_checkpoints: int = Field(3, ge=2)
    audit_db: str
    # the deny-list of revoked peer certificates (fingerprints; `party revoke`), re-read when it changes;
    # default <checkpoint_dir>/revoked.txt
    revoked_file: str | None = None
    # after a peer's key rotation (`party rotate`), its old certificate stays valid this long once the new one is in
    # use (requests in flight on a connection made before the switch), then it is retired onto the deny-list
    rotation_overlap_s: float = Field(30.0, ge=0)
    max_message_mb: float = Field(64.0, gt=0)
    max_batch: int = Field(4096, ge=1)  # hard limit on rows per message, independent of the policy
    max_abs_input: float = Field(1e6, gt=0)  # incoming activations/gradients beyond this magnitude are refused
    max_abs_param: float = Field(1e6, gt=0)  # an update that leaves a parameter beyond this is rolled back
    max_sessions_per_peer: int = Field(8, ge=1)  # open sessions (sequence state + one cached reply) per peer
    audit_refusals_every_s: float = Field(10.0, ge=0)  # wire/identity refusals: at most one record per peer per …
    # the label holder's gradient perturbation (governance.party.label_protection: a step on its reply), validated
    # when the config loads; on by default for the label holder (ignored by the others unless set); method = "none"
    # (or None) opts out
    label_protection: LabelProtectionConfig | None = Field(
        default_factory=lambda: DEFAULT_LABEL_PROTECTION.model_copy())
    integrity: IntegrityConfig = Field(default_factory=IntegrityConfig)  # steps bounded, sustained damage halted
    # opt-in int8 / top-k compression of the activations this party sends and the gradients it returns (default
    # none: exact, bit-identical); the receiver decodes what the message's spec names
    compression: CompressionConfig = Field(default_factory=CompressionConfig)
    # opt-in: the first party perturbs (noise) or decorrelates (NoPeek) the activations it sends, against input
    # reconstruction by the next party (governance.party.input_protection; measured by split audit-leakage)
    input_protection: InputProtectionConfig = Field(default_factory=InputProtectionConfig)
    anchor_every_s: float = Field(10.0, gt=0)  # every audit record anchored in a neighbour's log within this
    threads: int = Field(0, ge=0)  # torch threads (0 = torch default)
    timeout_s: float = Field(60.0, gt=0)  # per request to the next party
    connect_timeout_s: float = Field(20.0, gt=0)  # one connection attempt to the next party
    # the CPU priority of the late part of a step (weight gradients, optimizer step, check; after the answer):
    # "idle" never delays the step's critical path (the other parties' work and the transport), "normal" competes
    update_priority: Literal["idle", "normal"] = "idle"

    @field_validator("name")
    @classmethod
    def _name(cls, v: str) -> str:
        return check_name(v)

    @model_validator(mode="after")
    def _roles(self) -> PartyConfig:
        for role in ("prev", "next", "driver"):
            who = getattr(self, role)
            if role == "driver" and who == self.name:
                continue  # the driver runs at this party's site with this party's certificate
            if who is not None and who not in self.peers:
                raise ValueError(f"{role} = {who!r} is not a pinned peer; add [peers.{who}] with its fingerprint "
                                 f"(pinned peers: {sorted(self.peers)})")
        unknown = [p for p in self.policy.allow_peers if p not in self.peers and p != self.driver]
        if unknown:
            raise ValueError(f"policy.allow_peers {unknown} are not pinned peers; add [peers.<name>] fingerprint "
                             f"= \"sha256:…\" for each (pinned: {sorted(self.peers)})")
        if self.name in self.peers:
            raise ValueError(f"peers: a party does not pin itself ({self.name!r})")
        return self


def _resolve(base: Path, p: str | None) -> str | None:
    """An absolute, normalised path (relative paths are relative to `base`, the config file's folder)."""
    if p is None:
        return None
    q = Path(p).expanduser()
    return str((q if q.is_absolute() else (base / q)).resolve())


def load_party_config(path: str | Path, overrides: list[str] | None = None) -> PartyConfig:
    """Load PARTY.toml; relative paths are relative to the file's folder.

    Args:
        path: the TOML file.
        overrides: ``key=value`` strings (``--set``) applied before validation.

    Returns:
        The validated :class:`PartyConfig`; a bad field raises ``ConfigError`` naming it.

    Example:
        >>> cfg = load_party_config("parties/alice.toml", ["port=5001"])  # doctest: +SKIP
    """
    cfg = load_config(path, PartyConfig, overrides)
    return resolve_paths(cfg, Path(path).resolve().parent)


def resolve_paths(cfg: PartyConfig, base: Path) -> PartyConfig:
    cfg = cfg.model_copy(deep=True)
    cfg.tls = TLSConfig(ca=_resolve(base, cfg.tls.ca), cert=_resolve(base, cfg.tls.cert),
                        key=_resolve(base, cfg.tls.key))
    cfg.checkpoint_dir = _resolve(base, cfg.checkpoint_dir)
    cfg.audit_db = _resolve(base, cfg.audit_db)
    cfg.revoked_file = _resolve(base, cfg.revoked_file)
    cfg.address_file = _resolve(base, cfg.address_file)
    for peer in cfg.peers.values():
        peer.cert = _resolve(base, peer.cert)
    if cfg.init.checkpoint:
        cfg.init.checkpoint = _resolve(base, cfg.init.checkpoint)
    if cfg.data and cfg.data.file:
        cfg.data.file = _resolve(base, cfg.data.file)
    if cfg.policy_file:
        if cfg.policy != Policy():
            raise ConfigError("give the consent policy either as [policy] or as policy_file, not both")
        cfg.policy_file = _resolve(base, cfg.policy_file)
        cfg.policy = load_config(cfg.policy_file, Policy)
        unknown = [p for p in cfg.policy.allow_peers if p not in cfg.peers and p != cfg.driver]
        if unknown:
            raise ConfigError(f"{cfg.policy_file}: allow_peers {unknown} are not pinned peers of {cfg.name} "
                              f"(pinned: {sorted(cfg.peers)})")
    return cfg


def check_test_only(cfg: PartyConfig) -> None:
    """Refuse test-only options outside loopback (a reproducible init lets anyone who reads the config rebuild
    this party's initial parameters)."""
    if cfg.init.test_seed is not None and not is_loopback(cfg.host):
        raise ConfigError(f"party {cfg.name}: init.test_seed is a test-only option (it makes this party's initial "
                          f"parameters reproducible from the config) and is refused when serving on {cfg.host!r}; "
                          "remove it (the OS CSPRNG is used) or give init.checkpoint (your own file)")


def revoked_path(cfg: PartyConfig) -> Path:
    """The party's deny-list file (``revoked_file``, default ``<checkpoint_dir>/revoked.txt``)."""
    return Path(cfg.revoked_file) if cfg.revoked_file else Path(cfg.checkpoint_dir) / "revoked.txt"


def revoke_peer(cfg: PartyConfig, name: str) -> tuple[Path, str, bool]:
    """`modelward party revoke NAME`: put peer `name`'s pinned certificate on the party's deny-list; the running
    party refuses it from its next request on (re-read per request; audited).

    Args:
        cfg: the party's configuration (its ``[peers.<name>]`` pin and its ``revoked_file``).
        name: the peer to revoke (a ConfigError lists the pinned peers if it is not one).

    Returns:
        ``(deny-list file, the revoked fingerprint, whether it was added (False: already revoked))``.

    Example:
        >>> revoke_peer(load_party_config("party_bob.toml"), "alice")  # doctest: +SKIP
        (PosixPath('.../revoked.txt'), 'sha256:…', True)
    """

    table = pins(cfg)
    if name not in table:
        raise ConfigError(f"party {cfg.name}: {name!r} is not a pinned peer (pinned: {sorted(table)})")
    path = revoked_path(cfg)
    fp = normalize_fingerprint(table[name], f"peers.{name}")
    return path, fp, revoke(path, fp, name)


def pins(cfg: PartyConfig) -> dict[str, str]:
    """Peer name -> pinned fingerprint (read from the peer's certificate file where `cert` is given)."""
    out: dict[str, str] = {}
    for name, peer in cfg.peers.items():
        if peer.fingerprint is not None:
            out[name] = peer.fingerprint
        else:
            out[name] = cert_fingerprint(read_pem(peer.cert, f"peers.{name}.cert"))
    if cfg.driver == cfg.name:  # our own driver presents our own certificate
        out[cfg.name] = cert_fingerprint(read_pem(cfg.tls.cert, "tls.cert"))
    return out
