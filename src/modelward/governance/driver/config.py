"""The driver's configuration: the parties of a split in chain order, its identity, the training procedure.

Example:
    >>> cfg = SplitConfig(parties=[{"name": "alice", "address": "127.0.0.1:5001"},
    ...                            {"name": "bob", "address": "127.0.0.1:5002"}],
    ...                   tls={"ca": "ca.pem", "cert": "driver.pem", "key": "driver.key"})
    >>> [p.name for p in cfg.parties]
    ['alice', 'bob']
"""

from __future__ import annotations

from pathlib import Path

from pydantic import Field, model_validator

from modelward.core.config import StrictModel, load_config
from modelward.core.train import TrainConfig
from modelward.errors import ConfigError
from modelward.governance.party.config import TLSConfig, _resolve
from modelward.governance.trust.certs import check_name, read_pem
from modelward.governance.trust.identity import cert_fingerprint, normalize_fingerprint
from modelward.governance.trust.revocation import revoke


class PartyRef(StrictModel):
    name: str
    address: str | None = None  # host:port
    address_file: str | None = None  # or the file the party writes its address to (port 0, same host)
    fingerprint: str | None = None  # pin the party's certificate ("sha256:…"), or
    cert: str | None = None  # its certificate file (pinned by fingerprint)

    @model_validator(mode="after")
    def _one(self) -> PartyRef:
        if (self.address is None) == (self.address_file is None):
            raise ValueError(f"party {self.name}: give exactly one of address (host:port) or address_file")
        if self.fingerprint is not None and self.cert is not None:
            raise ValueError(f"party {self.name}: give fingerprint or cert, not both")
        return self

    def resolved_address(self) -> str:
        if self.address is not None:
            return self.address
        p = Path(self.address_file)
        if not p.is_file():
            raise ConfigError(f"party {self.name}: address_file {p} does not exist; start the party first "
                              f"(`modelward party serve …` writes it when it listens)")
        return p.read_text().strip()

    def pin(self) -> str | None:
        if self.cert is not None:
            return cert_fingerprint(read_pem(self.cert, f"parties.{self.name}.cert"))
        return self.fingerprint


class SplitConfig(StrictModel):
    """``SPLIT.toml``: the parties in chain order, the driver's identity, and the training procedure.

    Args:
        parties: at least 2 distinct parties in chain order (``name`` with ``address`` or ``address_file``,
            optionally a pinned ``fingerprint`` or ``cert``).
        tls: the driver's CA, client certificate and key (the identity the parties know as their ``driver``).
        train: the training procedure; seed: the data order.
        out_dir: where curves, steps and the session id go; session: the session id (default: a fresh one kept
            in ``out_dir/session.json`` so reruns resume).
        timeout_s: per request; retry_s: how long to wait for a crashed party; max_message_mb: message size limit.
        staleness: 0 (default: exact steps) or k = 1..2: bounded-staleness pipelining, k steps in flight on the
            first party's link, its updates delayed by k steps (weight stashing, PipeDream-2BW).

    Returns:
        A strict config for :func:`run_training`.

    Example:
        >>> cfg = SplitConfig(parties=[{"name": "alice", "address": "127.0.0.1:5001"},
        ...                            {"name": "bob", "address": "127.0.0.1:5002"}],
        ...                   tls={"ca": "ca.pem", "cert": "driver.pem", "key": "driver.key"})
        >>> [p.name for p in cfg.parties], cfg.timeout_s
        (['alice', 'bob'], 60.0)
    """

    parties: list[PartyRef]
    tls: TLSConfig  # the driver's client certificate (the identity the parties know as their `driver`)
    train: TrainConfig = Field(default_factory=TrainConfig)
    seed: int = 0  # data order (batch_order), as in core.train.train(seed=...)
    out_dir: str = "runs/split"
    session: str | None = None  # default: a fresh id, kept in out_dir/session.json so reruns resume
    timeout_s: float = Field(60.0, gt=0)  # per request
    connect_timeout_s: float = Field(20.0, gt=0)  # one connection attempt (TCP + TLS + HTTP/2: ~3 round trips)
    retry_s: float = Field(120.0, ge=0)  # how long to wait for a crashed party to come back
    max_message_mb: float = Field(64.0, gt=0)
    # the driver's deny-list of revoked party certificates (`modelward split revoke NAME SPLIT.toml`), checked at
    # every connection and before every call; default <out_dir>/revoked.txt
    revoked_file: str | None = None
    # bounded-staleness pipelining (opt-in; 0 = the exact synchronous steps): the first party keeps this many steps
    # in flight on its link, its updates delayed by as many steps (PipeDream-2BW; see docs/governance.md)
    staleness: int = Field(0, ge=0, le=2)

    @model_validator(mode="after")
    def _chain(self) -> SplitConfig:
        if len(self.parties) < 2:
            raise ValueError("parties: a split needs at least 2 parties ([[parties]] name/address, in chain order)")
        names = [check_name(p.name) for p in self.parties]
        if len(set(names)) != len(names):
            raise ValueError(f"parties: names must be distinct, got {names}")
        return self


def load_split_config(path: str | Path, overrides: list[str] | None = None) -> SplitConfig:
    """Read a ``modelward split train`` file (TOML) with ``--set`` style `overrides`; TLS paths are resolved
    relative to the file.

    Args:
        path: the TOML file.
        overrides: ``key=value`` strings applied before validation.

    Returns:
        The validated :class:`SplitConfig`; a bad field raises ConfigError naming it.

    Example:
        >>> cfg = load_split_config("split.toml", ["train.steps=50"])  # doctest: +SKIP
    """
    cfg = load_config(path, SplitConfig, overrides)
    base = Path(path).resolve().parent
    cfg.tls = TLSConfig(ca=_resolve(base, cfg.tls.ca), cert=_resolve(base, cfg.tls.cert),
                        key=_resolve(base, cfg.tls.key))
    cfg.out_dir = _resolve(base, cfg.out_dir)
    cfg.revoked_file = _resolve(base, cfg.revoked_file)
    for p in cfg.parties:
        p.address_file = _resolve(base, p.address_file)
        p.cert = _resolve(base, p.cert)
    return cfg


def split_revoked_path(cfg: SplitConfig) -> Path:
    """The driver's deny-list file (``revoked_file``, default ``<out_dir>/revoked.txt``)."""
    return Path(cfg.revoked_file) if cfg.revoked_file else Path(cfg.out_dir) / "revoked.txt"


def revoke_party(cfg: SplitConfig, name: str) -> tuple[Path, str, bool]:
    """`modelward split revoke NAME SPLIT.toml`: put party `name`'s pinned certificate on the driver's deny-list;
    the driver's clients refuse that party from their next call on (checked per call, no restart).

    Args:
        cfg: the split configuration (the party's pin: ``fingerprint`` or ``cert``; the driver's ``revoked_file``).
        name: the party to revoke (a ConfigError lists the parties if it is not one, or if it has no pin).

    Returns:
        ``(deny-list file, the revoked fingerprint, whether it was added (False: already revoked))``.

    Example:
        >>> revoke_party(load_split_config("split.toml"), "bob")  # doctest: +SKIP
        (PosixPath('.../revoked.txt'), 'sha256:…', True)
    """
    refs = {p.name: p for p in cfg.parties}
    if name not in refs:
        raise ConfigError(f"{name!r} is not a party of this split (parties: {list(refs)})")
    pin = refs[name].pin()
    if pin is None:
        raise ConfigError(f"parties.{name}: no fingerprint or cert is pinned, so there is nothing to revoke; pin "
                          "the party first")
    path = split_revoked_path(cfg)
    fp = normalize_fingerprint(pin, f"parties.{name}")
    return path, fp, revoke(path, fp, name)
