"""Entry points named in configs (``"package.module:factory"``) are code: they run only when the operator says so.

A config that names an entry point asks modelward to import a module and call one of its functions, which can do
anything the user can (``os:system`` runs a shell command). Like ``trust_remote_code`` in transformers — an argument
of the caller, never a field of the downloaded files — trust comes from the operator, never from the file (issue 37
item 3: ``trust_code = true`` written in a received config made ``guard check`` run ``os:system``). The operator says
so in one of three ways:

* for one command: ``modelward … --trust-code`` (sets ``MODELWARD_TRUST_CODE=1`` for the process and its workers);
* in their environment: ``MODELWARD_TRUST_CODE=1``;
* for one config file, as ``direnv allow`` does: ``modelward trust allow CONFIG`` records the file's SHA-256 in the
  operator's own trust list (``~/.config/modelward/trusted_configs.json``, or ``$MODELWARD_TRUST_DIR``); the config
  loader (:func:`modelward.core.config.load_config`) marks what it reads from a listed file as trusted, and editing
  the file revokes it (another hash). In Python, :func:`modelward.core.config.allow_code` marks a config object.

A config file that still carries the old ``trust_code`` key is refused with a message saying this. The check comes
*before* the import, so a refused entry point never runs a line.

Factories shipped with modelward and marked with :func:`shipped_factory` (e.g. ``modelward.cost.models:square_mlp``)
need no switch: importing a ``modelward.*`` module runs only modelware's own code, and only marked callables are
accepted without the switch.

Every place that resolves an entry point from a config calls :func:`load_entrypoint` (``[model] entrypoint``,
``[policy] approval``), so the rule lives here once.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import importlib
import json
import os
import stat
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

from modelward.errors import ConfigError, UntrustedCodeError

#: the process-wide switch (the CLI's ``--trust-code`` sets it; worker processes inherit it)
TRUST_ENV = "MODELWARD_TRUST_CODE"
#: where the operator's trust list lives (default: ``$XDG_CONFIG_HOME/modelward`` or ``~/.config/modelward``)
TRUST_DIR_ENV = "MODELWARD_TRUST_DIR"
TRUST_LIST = "trusted_configs.json"

F = TypeVar("F", bound=Callable[..., Any])


def trust_code(enabled: bool = True) -> None:
    """Let (or stop letting) configs run their entry points in this process and the processes it starts.

    Example:
        >>> trust_code(); code_trusted()
        True
        >>> trust_code(False); code_trusted()
        False
    """
    if enabled:
        os.environ[TRUST_ENV] = "1"
    else:
        os.environ.pop(TRUST_ENV, None)


def code_trusted() -> bool:
    """Whether the user said, for this process, that configs may run code (``--trust-code``)."""
    return os.environ.get(TRUST_ENV, "").strip().lower() in {"1", "true", "yes"}


def shipped_factory(fn: F) -> F:
    """Mark a factory shipped inside ``modelward`` as usable from a config without ``--trust-code``."""
    fn.__modelward_shipped__ = True  # type: ignore[attr-defined]
    return fn


def _split(spec: str, field: str, expected: str) -> tuple[str, str]:
    mod_name, sep, attr = spec.partition(":")
    if not sep or not mod_name or not attr:
        raise ConfigError(f"{field} {spec!r}: expected {expected!r}")
    return mod_name, attr


def _import(spec: str, field: str, mod_name: str, attr: str) -> Any:
    try:
        obj: Any = importlib.import_module(mod_name)
    except ImportError as e:
        raise ConfigError(f"{field} {spec!r}: cannot import {mod_name!r} ({e})") from None
    try:
        for part in attr.split("."):
            obj = getattr(obj, part)
    except AttributeError:
        raise ConfigError(f"{field} {spec!r}: module {mod_name!r} has no attribute {attr!r}") from None
    return obj


def _shipped(spec: str, field: str, mod_name: str, attr: str) -> Any | None:
    """The marked modelward factory `spec` names, else None (imports only modules of the modelward package)."""
    if mod_name != "modelward" and not mod_name.startswith("modelward."):
        return None
    try:
        obj = _import(spec, field, mod_name, attr)
    except ConfigError:
        return None
    return obj if getattr(obj, "__modelward_shipped__", False) is True else None


def how_to_trust(source: str | Path | None = None) -> str:
    """The three ways an operator trusts a config's code, for error messages (one line)."""
    allow = f"modelward trust allow {source}" if source else "modelward trust allow CONFIG"
    return (f"pass --trust-code, set {TRUST_ENV}=1 in your environment, or record this config file as trusted "
            f"with `{allow}` (its SHA-256 goes to your own trust list; editing the file revokes it)")


def check_trusted(spec: str, *, field: str, trusted: bool = False, source: str | Path | None = None) -> None:
    """Refuse `spec` unless the operator trusts configs' code (no import happens here).

    Args:
        spec: the entry point, ``"package.module:attr"``.
        field: where the config names it (``"model.entrypoint"``), quoted in the error.
        trusted: the operator's decision for this config object (``config.code_trusted``: set by the loader for a
            file in the operator's trust list, or by :func:`~modelward.core.config.allow_code`) — never a value
            read from the config itself.
        source: the config file, named in the refusal.

    Raises:
        UntrustedCodeError: one line naming the entry point and the operator's three switches.
    """
    # (worker processes see a config as JSON, without the mark: they need the process switch, which a study that
    # loaded a trusted config lends them for its run, as assess does)
    if trusted or code_trusted():
        return
    mod_name, _, attr = spec.partition(":")
    if _shipped(spec, field, mod_name, attr) is not None:
        return
    where = f"the config {source}" if source else "the config"
    raise UntrustedCodeError(
        f"{field} = {spec!r} is Python code named by {where}, and a config cannot authorise its own code: it runs "
        f"only if you trust it: {how_to_trust(source)}")


# ------------------------------------------------------------------ the operator's trust list (direnv-style)
def trust_dir() -> Path:
    """The operator's folder for the trust list (``$MODELWARD_TRUST_DIR``, else ``$XDG_CONFIG_HOME/modelward``,
    else ``~/.config/modelward``): the operator's, never named by a config."""
    if os.environ.get(TRUST_DIR_ENV):
        return Path(os.environ[TRUST_DIR_ENV])
    base = os.environ.get("XDG_CONFIG_HOME") or str(Path.home() / ".config")
    return Path(base) / "modelward"


def config_digest(data: bytes) -> str:
    """SHA-256 of a config file's bytes (what the trust list records)."""
    return hashlib.sha256(data).hexdigest()


def _read_list() -> dict[str, dict[str, str]]:
    path = trust_dir() / TRUST_LIST
    if not path.is_file():
        return {}
    mode = path.stat().st_mode
    if mode & (stat.S_IWGRP | stat.S_IWOTH):  # anyone else who can write the list could trust their own file
        raise ConfigError(f"{path}: the trust list is writable by other users, so it cannot say what you trust; "
                          f"make it yours alone (chmod 600 {path})")
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (ValueError, UnicodeDecodeError) as e:
        raise ConfigError(f"{path}: the trust list is not valid JSON ({e}); delete it and allow your configs "
                          "again with `modelward trust allow CONFIG`") from None
    return {k: v for k, v in data.items() if isinstance(v, dict)} if isinstance(data, dict) else {}


def _write_list(entries: dict[str, dict[str, str]]) -> Path:
    folder = trust_dir()
    folder.mkdir(parents=True, exist_ok=True, mode=0o700)
    path = folder / TRUST_LIST
    tmp = path.with_name(path.name + ".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w", encoding="utf-8") as f:
        f.write(json.dumps(entries, indent=2, sort_keys=True) + "\n")
    os.replace(tmp, path)
    return path


def allow_config(path: str | Path) -> str:
    """Record ``path``'s current contents as trusted (``modelward trust allow``); returns its SHA-256.

    Example:
        >>> allow_config("examples/assess_own_model.toml")  # doctest: +SKIP
        '3f2a…'
    """
    p = Path(path)
    if not p.is_file():
        raise ConfigError(f"{p}: config file not found")
    digest = config_digest(p.read_bytes())
    entries = _read_list()
    entries[digest] = {"path": str(p.resolve()), "allowed": dt.datetime.now(dt.UTC).isoformat(timespec="seconds")}
    _write_list(entries)
    return digest


def revoke_config(path: str | Path) -> int:
    """Remove ``path`` from the trust list (every recorded version of it, and its current contents); returns how
    many entries went."""
    p = Path(path)
    digest = config_digest(p.read_bytes()) if p.is_file() else None
    entries = _read_list()
    gone = [d for d, e in entries.items() if d == digest or e.get("path") == str(p.resolve())]
    for d in gone:
        del entries[d]
    if gone:
        _write_list(entries)
    return len(gone)


def allowed_configs() -> list[dict[str, str]]:
    """The trust list: one ``{"sha256", "path", "allowed"}`` per entry, and whether the file still matches."""
    out = []
    for d, e in sorted(_read_list().items(), key=lambda kv: kv[1].get("path", "")):
        p = Path(e.get("path", ""))
        now = config_digest(p.read_bytes()) if p.is_file() else None
        out.append({"sha256": d, "path": str(p), "allowed": e.get("allowed", ""),
                    "state": "trusted" if now == d else ("missing" if now is None else "changed since allowed")})
    return out


def config_allowed(data: bytes) -> bool:
    """Whether these config bytes are in the operator's trust list."""
    entries = _read_list()
    return bool(entries) and config_digest(data) in entries


def load_entrypoint(spec: str, *, field: str = "model.entrypoint", trusted: bool = False,
                    source: str | Path | None = None, expected: str = "package.module:factory") -> Any:
    """Import the object ``package.module:attr`` named by a config, only if the user trusts configs' code.

    The trust check runs before anything is imported: a refused entry point never runs.

    Args:
        spec: ``"package.module:attr"`` (``attr`` may be dotted: ``"pkg.mod:Class.build"``).
        field: the config field naming it (quoted in errors).
        trusted: the operator's decision for the config object naming it (``config.code_trusted``).
        source: the config file, named in the refusal.
        expected: the expected shape of `spec`, quoted when it is malformed.

    Returns:
        The imported object (a factory, class or function).

    Raises:
        ConfigError: `spec` is malformed or does not resolve; :class:`UntrustedCodeError` (a ConfigError) when the
        operator has not said they trust it.

    Example:
        >>> load_entrypoint("modelward.cost.models:square_mlp").__name__  # shipped: no switch needed
        'square_mlp'
        >>> load_entrypoint("os:system")  # doctest: +IGNORE_EXCEPTION_DETAIL
        Traceback (most recent call last):
        modelward.errors.UntrustedCodeError: model.entrypoint = 'os:system' is Python code ...
    """
    mod_name, attr = _split(spec, field, expected)
    check_trusted(spec, field=field, trusted=trusted, source=source)
    return _import(spec, field, mod_name, attr)
