"""API keys for operators: list, add, revoke and reset the budget of a guard's keys without SQL
(``modelward guard keys ...``), also while the server runs (it re-reads the keys every 2 s).

Keys from the config file stay in the config; keys added here live in the guard's store (``state_dir``/query log),
which keeps only their SHA-256: the key itself is printed once, when it is made. Placeholder keys — the
``change-me-…`` keys of the examples and docs — are refused when a server starts (:func:`placeholder_keys`).
"""

from __future__ import annotations

import re
import secrets
from dataclasses import dataclass
from pathlib import Path

from modelward.errors import ConfigError
from modelward.extraction.guard.config import GuardConfig, load_guard_config
from modelward.extraction.guard.querylog import QueryLog

_PLACEHOLDER = re.compile(r"^(change[-_]?me|replace[-_]?me|your[-_]|example[-_]|placeholder|xxxx|todo[-_])",
                          re.IGNORECASE)


def placeholder_keys(cfg: GuardConfig) -> list[str]:
    """Names of the config's keys that look like documentation placeholders (``change-me-…`` and the like)."""
    return [k.name for k in cfg.keys if _PLACEHOLDER.match(k.key)]


def refuse_placeholder_keys(cfg: GuardConfig, path: str | Path) -> None:
    """ConfigError naming every placeholder key: a server must not start with a key anyone can read in the docs."""
    bad = placeholder_keys(cfg)
    if bad:
        raise ConfigError(f"{path}: keys {bad} are placeholders from the examples (anyone who read the docs knows "
                          "them); put a secret in each `key` (e.g. python -c \"import secrets; "
                          "print(secrets.token_urlsafe(32))\") or remove them and use 'modelward guard keys add'")


@dataclass(frozen=True)
class KeyInfo:
    """One key as an operator sees it (never the key itself)."""

    name: str
    source: str  # "config" or "store"
    budget: int | None
    used: int
    revoked: bool


def open_store(config_path: str | Path) -> tuple[GuardConfig, QueryLog]:
    """The config and the guard's store (query log) it names; the store is created if missing."""
    path = Path(config_path)
    cfg = load_guard_config(path)
    s = cfg.server
    store = QueryLog(path.resolve().parent / s.state_dir / s.query_log, busy_timeout=s.busy_timeout_s)
    return cfg, store


def list_keys(config_path: str | Path) -> list[KeyInfo]:
    """Every key of the guard: from the config and added by operators, with budget, usage and revocation.

    Example:
        >>> for k in list_keys("guard.toml"): print(k.name, k.used, k.budget)  # doctest: +SKIP
    """
    cfg, store = open_store(config_path)
    try:
        usage, stored = store.usage(), store.stored_keys()
    finally:
        store.close()
    revoked = {k.name for k in stored if k.revoked}
    out = [KeyInfo(k.name, "config", k.budget, usage.get(k.name, 0), k.name in revoked) for k in cfg.keys]
    names = {k.name for k in cfg.keys}
    out += [KeyInfo(k.name, "store", k.budget, usage.get(k.name, 0), k.revoked) for k in stored
            if k.name not in names and k.key_sha256 is not None]
    return out


def add_key(config_path: str | Path, name: str, budget: int | None = None) -> str:
    """Make a new random key ``name`` with ``budget`` rows (None = unlimited); returns the key (shown only once)."""
    if not name or not all(ch.isalnum() or ch in "-_." for ch in name):
        raise ConfigError(f"key name {name!r}: use letters, digits, '-', '_' or '.'")
    if budget is not None and budget < 0:
        raise ConfigError(f"--budget must be >= 0, got {budget}")
    cfg, store = open_store(config_path)
    try:
        taken = {k.name for k in cfg.keys} | {k.name for k in store.stored_keys()}
        if name in taken:
            raise ConfigError(f"key name {name!r} is taken (config or store); existing: {sorted(taken)}")
        key = "mw-" + secrets.token_urlsafe(32)
        store.add_key(name, key, budget)
        return key
    finally:
        store.close()


def _known(config_path: str | Path, name: str) -> tuple[GuardConfig, QueryLog]:
    cfg, store = open_store(config_path)
    names = {k.name for k in cfg.keys} | {k.name for k in store.stored_keys() if k.key_sha256 is not None}
    if name not in names:
        store.close()
        raise ConfigError(f"no key named {name!r}; keys: {sorted(names)}")
    return cfg, store


def revoke_key(config_path: str | Path, name: str) -> None:
    """Refuse key ``name`` from now on (a running server within 2 s); its usage is kept."""
    _, store = _known(config_path, name)
    try:
        store.revoke_key(name)
    finally:
        store.close()


def reset_budget(config_path: str | Path, name: str, used: int = 0) -> None:
    """Set the rows key ``name`` has used (default 0: its whole budget is available again)."""
    if used < 0:
        raise ConfigError(f"--used must be >= 0, got {used}")
    _, store = _known(config_path, name)
    try:
        store.reset_usage(name, used)
    finally:
        store.close()
