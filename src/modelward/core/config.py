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


def _models_in(annotation: Any) -> list[type[BaseModel]]:
    """The pydantic models an annotation can hold (``X``, ``X | None``, ``list[X]``, ``dict[str, X]``, ...)."""
    import typing

    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return [annotation]
    out: list[type[BaseModel]] = []
    for arg in typing.get_args(annotation):
        out += _models_in(arg)
    return out


def _fields_at(model: type[BaseModel] | None, loc: tuple[Any, ...]) -> list[str]:
    """The field names valid at `loc` (the parent of an unknown key), following nested models."""
    models = [model] if model is not None else []
    for part in loc:
        if isinstance(part, int) or (isinstance(part, str) and part.startswith("function-")):
            continue  # a list index or a validator's wrapper: same models
        nxt: list[type[BaseModel]] = []
        for m in models:
            f = m.model_fields.get(str(part))
            if f is not None:
                nxt += _models_in(f.annotation)
        if not nxt:
            return []
        models = nxt
    names: list[str] = []
    for m in models:
        names += [n for n in m.model_fields if not n.startswith("_")]
    return names


def did_you_mean(word: str, choices: list[str]) -> str:
    """``" (did you mean 'x'?)"`` for the closest of `choices` to `word` (difflib), or ``""``.

    Example:
        >>> did_you_mean("lerning_rate", ["lr", "learning_rate", "steps"])
        " (did you mean 'learning_rate'?)"
    """
    import difflib

    close = difflib.get_close_matches(word, choices, n=1, cutoff=0.6)
    if not close:  # a longer or shorter spelling of a name: "architecture" for "arch"
        close = [c for c in choices if min(len(c), len(word)) >= 3 and (word.startswith(c) or c.startswith(word))]
    return f" (did you mean {close[0]!r}?)" if close else ""


def format_validation_error(err: ValidationError, source: str, model: type[BaseModel] | None = None,
                            overrides: list[str] | None = None) -> str:
    """Turn a pydantic error into one line per bad field: 'source: field: problem (valid: ...)'.

    Args:
        err: the pydantic error.
        source: where the values came from (the file), named at the start of each line.
        model: the config model, to suggest the closest valid name for an unknown key ("did you mean").
        overrides: the ``--set key=value`` items applied on top of the file: a bad field one of them set is
            blamed on that ``--set``, not on the file.
    """
    lines = []
    set_paths = []
    for item in overrides or []:
        try:
            set_paths.append((tuple(parse_override(item)[0]), item))
        except ConfigError:
            continue
    for e in err.errors():
        msg = e["msg"]
        ctx = e.get("ctx") or {}
        loc = tuple(p for p in e["loc"] if not (isinstance(p, str) and p.startswith("function-")))
        if e["type"] == "literal_error" and "expected" in ctx:
            msg = f"got {e.get('input')!r}; valid choices: {ctx['expected']}"
        elif e["type"] == "extra_forbidden":
            hint = did_you_mean(str(loc[-1]), _fields_at(model, loc[:-1])) if loc else ""
            msg = f"unknown field{hint or ' (check spelling; see the example configs in examples/)'}"
        elif e["type"] == "missing":
            msg = "required field is missing"
        where = source
        key = tuple(str(p) for p in loc)
        for path, item in reversed(set_paths):  # the last --set of a key wins, as when applying them
            if key[:len(path)] == path or path[:len(key)] == key:
                where = f"--set {item}"
                break
        lines.append(f"{where}: field '{_loc(e['loc'])}': {msg}")
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


def validate(model: type[M], data: dict[str, Any], source: str = "config",
             overrides: list[str] | None = None) -> M:
    """Validate `data` as `model`; errors name the field, the closest valid name and the ``--set`` at fault."""
    try:
        return model.model_validate(data)
    except ValidationError as e:
        raise ConfigError(format_validation_error(e, source, model, overrides)) from None


def load_config(path: str | Path, model: type[M], overrides: list[str] | None = None) -> M:
    """Load a TOML file into `model`, applying `--set key=value` overrides first (an error in a value a ``--set``
    gave is blamed on that ``--set``)."""
    data = apply_overrides(read_toml(path), overrides)
    return validate(model, data, str(path), overrides)


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
