"""Entry points named in configs (``"package.module:factory"``) are code: they run only when the user says so.

A config that names an entry point asks modelward to import a module and call one of its functions, which can do
anything the user can (``os:system`` runs a shell command). Like other tools' ``trust_remote_code``, modelward runs
such code only when the user opts in, either for one command (``modelward … --trust-code``, which sets
``MODELWARD_TRUST_CODE=1`` for the process and its workers) or in the config table that names the entry point
(``trust_code = true``). The check comes *before* the import, so a refused entry point never runs a line.

Factories shipped with modelward and marked with :func:`shipped_factory` (e.g. ``modelward.cost.models:square_mlp``)
need no switch: importing a ``modelward.*`` module runs only modelware's own code, and only marked callables are
accepted without the switch.

Every place that resolves an entry point from a config calls :func:`load_entrypoint` (``[model] entrypoint``,
``[policy] approval``), so the rule lives here once.
"""

from __future__ import annotations

import importlib
import os
from collections.abc import Callable
from typing import Any, TypeVar

from modelward.errors import ConfigError, UntrustedCodeError

#: the process-wide switch (the CLI's ``--trust-code`` sets it; worker processes inherit it)
TRUST_ENV = "MODELWARD_TRUST_CODE"

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


def check_trusted(spec: str, *, field: str, trusted: bool = False, switch: str = "trust_code = true") -> None:
    """Refuse `spec` unless the user trusts configs' code (no import happens here).

    Args:
        spec: the entry point, ``"package.module:attr"``.
        field: where the config names it (``"model.entrypoint"``), quoted in the error.
        trusted: the config's own switch (its ``trust_code`` field).
        switch: how to set that switch, quoted in the error.

    Raises:
        UntrustedCodeError: one line naming the entry point and both switches.
    """
    if trusted or code_trusted():
        return
    mod_name, _, attr = spec.partition(":")
    if _shipped(spec, field, mod_name, attr) is not None:
        return
    raise UntrustedCodeError(
        f"{field} = {spec!r} is Python code named by the config, and code from a config runs only if you trust it: "
        f"pass --trust-code, or set {switch}")


def load_entrypoint(spec: str, *, field: str = "model.entrypoint", trusted: bool = False,
                    switch: str = "trust_code = true in [model]",
                    expected: str = "package.module:factory") -> Any:
    """Import the object ``package.module:attr`` named by a config, only if the user trusts configs' code.

    The trust check runs before anything is imported: a refused entry point never runs.

    Args:
        spec: ``"package.module:attr"`` (``attr`` may be dotted: ``"pkg.mod:Class.build"``).
        field: the config field naming it (quoted in errors).
        trusted: the config's own ``trust_code`` switch.
        switch: how to set that switch, quoted in the refusal.
        expected: the expected shape of `spec`, quoted when it is malformed.

    Returns:
        The imported object (a factory, class or function).

    Raises:
        ConfigError: `spec` is malformed or does not resolve; :class:`UntrustedCodeError` (a ConfigError) when the
        user has not opted in.

    Example:
        >>> load_entrypoint("modelward.cost.models:square_mlp").__name__  # shipped: no switch needed
        'square_mlp'
        >>> load_entrypoint("os:system")  # doctest: +IGNORE_EXCEPTION_DETAIL
        Traceback (most recent call last):
        modelward.errors.UntrustedCodeError: model.entrypoint = 'os:system' is Python code ...
    """
    mod_name, attr = _split(spec, field, expected)
    check_trusted(spec, field=field, trusted=trusted, switch=switch)
    return _import(spec, field, mod_name, attr)
