"""How the driver reaches the parties: gRPC with mutual TLS (pinned, revocation-checked, following key rotations),
or a party hosted in the driver's own process.

Example:
    >>> drv = SplitDriver(cfg, connect=hosted_connect(alice, cfg))  # doctest: +SKIP
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from modelward.errors import ConfigError
from modelward.governance.driver.config import PartyRef, SplitConfig, split_revoked_path
from modelward.governance.party.machine import Party
from modelward.governance.protocol import PartyClient
from modelward.governance.transport.client import GrpcPartyClient, InProcessClient
from modelward.governance.trust.identity import normalize_fingerprint
from modelward.governance.trust.revocation import DenyList, revoked_server_check
from modelward.governance.trust.rotation import PeerTrust, RotationStore

Connect = Callable[[PartyRef, SplitConfig], PartyClient]


def grpc_connect(ref: PartyRef, cfg: SplitConfig) -> PartyClient:
    """A gRPC + mutual-TLS link to party `ref`, pinned, and checked against the driver's deny-list
    (``revoked_file``) at every connection and before every call: a revoked party is not called. With a pin, it
    follows the party's key rotations (its statement verified against the pin, what was followed kept in
    ``<out_dir>/rotations/<name>.json``)."""
    pin = ref.pin()
    trust = None
    if pin is not None:
        trust = PeerTrust({ref.name: normalize_fingerprint(pin, f"parties.{ref.name}")},
                          RotationStore(Path(cfg.out_dir) / "rotations" / f"{ref.name}.json"))
        pin = trust.pins[ref.name]
    return GrpcPartyClient(ref.name, ref.resolved_address(), cfg.tls, pin, cfg.max_message_mb, cfg.timeout_s,
                           connect_timeout=cfg.connect_timeout_s, trust=trust,
                           peer_check=revoked_server_check(DenyList(split_revoked_path(cfg))))


def hosted_connect(host: Party, cfg: SplitConfig) -> Connect:
    """Reach `host` — a party running inside the driver's process (:func:`governance.transport.server.hosted_party`) —
    directly, as its configured driver, and every other party over gRPC with mutual TLS.

    Args:
        host: the hosted party (normally the first one, run by the organisation that drives the training).
        cfg: the split configuration; it must list the hosted party.

    Returns:
        A ``connect(ref, cfg)`` for :class:`SplitDriver`.

    Example:
        >>> drv = SplitDriver(cfg, connect=hosted_connect(alice, cfg))  # doctest: +SKIP
    """
    names = [p.name for p in cfg.parties]
    if host.cfg.name not in names:
        raise ConfigError(f"--host: party {host.cfg.name!r} is not one of this split's parties {names}")

    def connect(ref: PartyRef, c: SplitConfig) -> PartyClient:
        if ref.name == host.cfg.name:
            return InProcessClient(host, caller=host.cfg.driver)
        return grpc_connect(ref, c)

    return connect
