"""TOML configs -> pydantic models. Errors name the offending field and, where there are any, the valid choices."""

from __future__ import annotations

import json
import tomllib
from pathlib import Path
from typing import Any, TypeVar

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from modelward.errors import ConfigError

M = TypeVar("M", bound=BaseModel)


class StrictModel(BaseModel):
    """Base for every config section: unknown keys are errors, values are validated on assignment."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True, frozen=False, protected_namespaces=())


class AlgorithmSpec(StrictModel):
    """One algorithm chosen by name with its keyword parameters: a config's ``[[attacks]]`` / ``[[defenses]]`` row.

    The areas validate ``name`` and ``params`` against their :class:`~modelward.core.registry.Registry`
    (evasion attacks, extraction defenses, membership attacks); subclasses add area-specific fields.

    Args:
        name: the registry name (``"pgd"``, ``"modelguard_s"``, ``"lira"`` ...).
        params: keyword parameters for the algorithm's constructor (empty: its defaults).
        label: the row's name in result tables (default: ``name``), so one algorithm can appear twice.

    Example:
        >>> AlgorithmSpec(name="pgd", params={"steps": 40}).key
        'pgd'
    """

    name: str
    params: dict[str, Any] = Field(default_factory=dict)
    label: str | None = None

    @property
    def key(self) -> str:
        """The row's name in result tables."""
        return self.label or self.name


def _loc(loc: tuple[Any, ...]) -> str:
    parts = [str(p) for p in loc if not (isinstance(p, str) and p.startswith("function-"))]
    return ".".join(parts) or "<root>"


def format_validation_error(err: ValidationError, source: str) -> str:
    """Turn a pydantic error into one line per bad field: 'source: field: problem (valid: ...)'."""
    lines = []
    for e in err.errors():
        msg = e["msg"]
        ctx = e.get("ctx") or {}
        if e["type"] == "literal_error" and "expected" in ctx:
            msg = f"got {e.get('input')!r}; valid choices: {ctx['expected']}"
        elif e["type"] == "extra_forbidden":
            msg = "unknown field (check spelling; see the example configs in examples/)"
        elif e["type"] == "missing":
            msg = "required field is missing"
        lines.append(f"{source}: field '{_loc(e['loc'])}': {msg}")
    return "\n".join(lines)


def parse_override(item: str) -> tuple[list[str], Any]:
    """Parse one `--set a.b.c=value` override; the value is read as TOML/JSON if possible, else a string."""
    if "=" not in item:
        raise ConfigError(f"override {item!r}: expected key=value, e.g. train.steps=200")
    key, raw = item.split("=", 1)
    key = key.strip()
    if not key:
        raise ConfigError(f"override {item!r}: empty key")
    raw = raw.strip()
    value: Any
    try:
        value = tomllib.loads(f"v = {raw}")["v"]
    except tomllib.TOMLDecodeError:
        try:
            value = json.loads(raw)
        except json.JSONDecodeError:
            value = raw
    return key.split("."), value


def apply_overrides(data: dict[str, Any], overrides: list[str] | None) -> dict[str, Any]:
    for item in overrides or []:
        path, value = parse_override(item)
        node: Any = data
        for i, p in enumerate(path):
            last = i == len(path) - 1
            if isinstance(node, list):  # an array (of tables): `procedures.0.kind=T3`
                if not p.isdigit() or int(p) >= len(node):
                    raise ConfigError(f"override {item!r}: '{'.'.join(path[:i])}' is an array of {len(node)} "
                                      f"item(s); use an index 0..{len(node) - 1}, e.g. "
                                      f"{'.'.join([*path[:i], '0', *path[i + p.isdigit():]])}")
                if last:
                    node[int(p)] = value
                else:
                    node = node[int(p)]
                continue
            if not isinstance(node, dict):
                raise ConfigError(f"override {item!r}: '{'.'.join(path[:i])}' is a value, not a table")
            if last:
                node[p] = value
            else:
                node = node.setdefault(p, {})
    return data


def read_toml(path: str | Path) -> dict[str, Any]:
    p = Path(path)
    if not p.is_file():
        raise ConfigError(f"{p}: config file not found")
    try:
        return tomllib.loads(p.read_text(encoding="utf-8"))
    except tomllib.TOMLDecodeError as e:
        raise ConfigError(f"{p}: not valid TOML: {e}") from None
    except UnicodeDecodeError:
        raise ConfigError(f"{p}: not a UTF-8 text file") from None


def validate(model: type[M], data: dict[str, Any], source: str = "config") -> M:
    try:
        return model.model_validate(data)
    except ValidationError as e:
        raise ConfigError(format_validation_error(e, source)) from None


def load_config(path: str | Path, model: type[M], overrides: list[str] | None = None) -> M:
    """Load a TOML file into `model`, applying `--set key=value` overrides first."""
    data = apply_overrides(read_toml(path), overrides)
    return validate(model, data, str(path))


def _drop_none(v: Any) -> Any:
    if isinstance(v, dict):
        return {k: _drop_none(x) for k, x in v.items() if x is not None}
    if isinstance(v, list | tuple):
        return [_drop_none(x) for x in v]
    return v


def to_toml(data: dict[str, Any]) -> str:
    """Serialise a config dict as TOML (None values are left out: TOML has no null)."""
    import tomli_w

    return tomli_w.dumps(_drop_none(data))


def dump_config(cfg: BaseModel, path: str | Path) -> None:
    """Write the resolved config as TOML-like JSON (JSON is a subset reviewers can diff; TOML writer optional)."""
    Path(path).write_text(json.dumps(cfg.model_dump(mode="json"), indent=2, sort_keys=True) + "\n")
