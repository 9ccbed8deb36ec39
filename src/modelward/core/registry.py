"""Name -> class (or factory) registries with lazy imports, and lazy module exports.

A :class:`Registry` maps user-facing names (the ``name = "pgd"`` of a config file) to classes or factory
functions. Entries are added eagerly with the :meth:`Registry.register` decorator or lazily with
:meth:`Registry.add` (``"package.module:Attr"``, imported on first use, so listing names stays cheap). Unknown
names and unknown parameters raise :class:`~modelward.errors.ConfigError` naming the valid choices.

:func:`lazy_exports` gives a package ``__init__`` a module-level ``__getattr__`` / ``__dir__`` pair, so that
``from modelward.<area>.<family> import <Class>`` works without importing every module of the family up front.

Example:
    >>> attacks = Registry("attack")
    >>> @attacks.register("noop")
    ... class Noop:
    ...     def __init__(self, eps: float = 0.1) -> None:
    ...         self.eps = eps
    >>> attacks.create("noop", eps=0.3).eps
    0.3
    >>> attacks.names()
    ['noop']
"""

from __future__ import annotations

import importlib
import inspect
from collections.abc import Callable, Iterator
from typing import Any, TypeVar

from modelward.errors import ConfigError

T = TypeVar("T")


def _import(target: str) -> Any:
    module, _, attr = target.partition(":")
    if not module or not attr:
        raise ValueError(f"lazy target {target!r}: use 'package.module:Attr'")
    obj: Any = importlib.import_module(module)
    for part in attr.split("."):
        obj = getattr(obj, part)
    return obj


class Registry:
    """Names of one kind of thing (``kind``: "attack", "defense", ...) -> classes or factories.

    Args:
        kind: what the entries are, used in error messages ("unknown attack 'x'; valid choices: ...").
    """

    def __init__(self, kind: str) -> None:
        self.kind = kind
        self._entries: dict[str, Any] = {}  # a loaded object, or a "module:attr" string not yet imported

    def register(self, name: str) -> Callable[[T], T]:
        """Decorator registering a class or function under `name` (a second registration of a name fails)."""

        def deco(obj: T) -> T:
            self._put(name, obj)
            return obj

        return deco

    def add(self, name: str, target: str) -> None:
        """Register ``"package.module:Attr"`` under `name`; it is imported on first :meth:`get`."""
        module, _, attr = target.partition(":")
        if not module or not attr:
            raise ValueError(f"{self.kind} {name!r}: lazy target {target!r} must look like 'package.module:Attr'")
        self._put(name, target)

    def _put(self, name: str, obj: Any) -> None:
        if name in self._entries and self._entries[name] is not obj:
            raise ValueError(f"{self.kind} {name!r} is registered twice")
        self._entries[name] = obj

    def names(self) -> list[str]:
        """All registered names, sorted."""
        return sorted(self._entries)

    def __contains__(self, name: object) -> bool:
        return name in self._entries

    def __iter__(self) -> Iterator[str]:
        return iter(self.names())

    def __len__(self) -> int:
        return len(self._entries)

    def get(self, name: str) -> Any:
        """The class/factory registered under `name` (imported now if lazy).

        Raises:
            ConfigError: `name` is unknown; the message lists the valid choices.
        """
        if name not in self._entries:
            raise ConfigError(f"unknown {self.kind} {name!r}; valid choices: {self.names()}")
        obj = self._entries[name]
        if isinstance(obj, str):
            obj = self._entries[name] = _import(obj)
        return obj

    def parameters(self, name: str) -> list[str]:
        """The keyword parameters `name` accepts (from its signature; ``*args``/``**kwargs`` excluded)."""
        sig = inspect.signature(self.get(name))
        return [p.name for p in sig.parameters.values()
                if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY) and p.name != "self"]

    def create(self, name: str, /, *args: Any, **params: Any) -> Any:
        """Instantiate (call) `name` with `params`.

        Raises:
            ConfigError: unknown name, or a parameter the entry does not accept (the message lists the valid
                ones); an entry taking ``**kwargs`` accepts anything.
        """
        obj = self.get(name)
        try:
            sig = inspect.signature(obj)
        except (TypeError, ValueError):  # builtins without a signature: let the call decide
            return obj(*args, **params)
        if not any(p.kind is p.VAR_KEYWORD for p in sig.parameters.values()):
            valid = self.parameters(name)[len(args):]  # those filled positionally are not keyword choices
            bad = sorted(set(params) - set(valid))
            if bad:
                raise ConfigError(f"{self.kind} {name!r}: unknown parameter(s) {bad}; valid: {valid}")
        return obj(*args, **params)


def lazy_exports(module_name: str, exports: dict[str, str]) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
    """A module-level ``__getattr__`` / ``__dir__`` pair importing `exports` on first access.

    Args:
        module_name: the package's ``__name__`` (used in the AttributeError message).
        exports: public name -> ``"package.module:Attr"``.

    Example (in a package ``__init__``)::

        __getattr__, __dir__ = lazy_exports(__name__, {"PGD": "modelward.robustness.attacks.pgd:PGD"})
    """
    import sys

    def __getattr__(name: str) -> Any:  # noqa: N807 - the module protocol's name
        if name not in exports:
            raise AttributeError(f"module {module_name!r} has no attribute {name!r}")
        value = _import(exports[name])
        setattr(sys.modules[module_name], name, value)  # cache: later lookups skip __getattr__
        return value

    def __dir__() -> list[str]:  # noqa: N807
        return sorted(set(vars(sys.modules[module_name])) | set(exports))

    return __getattr__, __dir__
