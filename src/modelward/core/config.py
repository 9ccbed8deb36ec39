"""TOML configs -> pydantic models. Errors name the offending field and, where there are any, the valid choices."""

from __future__ import annotations

import json
import tomllib
from pathlib import Path
from typing import Any, TypeVar

from pydantic import BaseModel, ConfigDict, Field, PrivateAttr, ValidationError, model_validator

from modelward.core.entrypoints import config_allowed, how_to_trust
from modelward.errors import ConfigError

M = TypeVar("M", bound=BaseModel)


class StrictModel(BaseModel):
    """Base for every config section: unknown keys are errors, values are validated on assignment.

    ``code_trusted`` says whether the *operator* trusts the code (entry points) this config names: set by
    :func:`load_config` for a file in the operator's trust list (``modelward trust allow``) or by :func:`allow_code`,
    never by the file's contents (a private attribute: no key of a file or dict can set it; dumps never carry it).
    """

    model_config = ConfigDict(extra="forbid", validate_assignment=True, frozen=False, protected_namespaces=())
    _code_trusted: bool = PrivateAttr(default=False)
    _config_source: str | None = PrivateAttr(default=None)

    @model_validator(mode="before")
    @classmethod
    def _retired_trust_key(cls, data: Any) -> Any:
        # the old switch, from Python (``ModelConfig(trust_code=True)``) or any dict: say what replaced it
        if isinstance(data, dict) and "trust_code" in data:
            raise ValueError(retired_trust_key("trust_code").removeprefix("field 'trust_code': "))
        return data

    def __eq__(self, other: object) -> bool:
        # as pydantic's, without the private attributes: where a config came from and whether its operator trusts
        # its code are not part of its value (a policy loaded from a trusted file equals the same policy built here)
        if not isinstance(other, BaseModel):
            return NotImplemented
        return (type(self) is type(other) and self.__dict__ == other.__dict__
                and self.__pydantic_extra__ == other.__pydantic_extra__)

    __hash__ = None  # type: ignore[assignment] - mutable, as pydantic's default

    @property
    def code_trusted(self) -> bool:
        """Whether the operator trusts the entry points this config names (see :func:`allow_code`)."""
        return self._code_trusted

    @property
    def config_source(self) -> str | None:
        """The file this config was loaded from (named in refusals), if any."""
        return self._config_source


def _mark(obj: Any, trusted: bool, source: str | None) -> None:
    if isinstance(obj, StrictModel):
        obj._code_trusted = trusted
        if source is not None:
            obj._config_source = source
        for name in type(obj).model_fields:
            _mark(getattr(obj, name), trusted, source)
    elif isinstance(obj, list | tuple):
        for x in obj:
            _mark(x, trusted, source)
    elif isinstance(obj, dict):
        for x in obj.values():
            _mark(x, trusted, source)


def allow_code(cfg: M) -> M:
    """Mark a config object (and every section in it) as trusted by the caller: its entry points may run. The
    Python counterpart of ``--trust-code`` for one object, like transformers' ``trust_remote_code=True``.

    Args:
        cfg: a config built in your own code (or loaded from a file you checked).

    Returns:
        ``cfg`` itself, marked.

    Example:
        >>> from modelward.core.zoo import ModelConfig
        >>> allow_code(ModelConfig(arch="entrypoint", entrypoint="torch.nn:Identity")).code_trusted
        True
    """
    _mark(cfg, True, None)
    return cfg


def _trust_keys(data: Any, loc: tuple[str, ...] = ()) -> list[str]:
    """Where a config's data still carries the retired ``trust_code`` key (dotted locations)."""
    out: list[str] = []
    if isinstance(data, dict):
        for k, v in data.items():
            if k == "trust_code":
                out.append(".".join((*loc, k)))
            out += _trust_keys(v, (*loc, str(k)))
    elif isinstance(data, list):
        for i, v in enumerate(data):
            out += _trust_keys(v, (*loc, str(i)))
    return out


def retired_trust_key(where: str, source: str | None = None) -> str:
    """The message for a config that still carries ``trust_code`` (retired by issue 37 item 3)."""
    return (f"field '{where}': a config can no longer authorise its own code (whoever wrote the file could run "
            f"anything as you). Delete the trust_code line; then, if you trust the code this config names: "
            f"{how_to_trust(source)}")


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
        elif e["type"] == "extra_forbidden" and loc and loc[-1] == "trust_code":
            lines.append(f"{source}: {retired_trust_key(_loc(e['loc']))}")
            continue
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
    return _read_toml(path)[0]


def _read_toml(path: str | Path) -> tuple[dict[str, Any], bytes]:
    """The parsed file and the bytes it was parsed from (what the trust list's hash is of)."""
    p = Path(path)
    if not p.is_file():
        raise ConfigError(f"{p}: config file not found")
    raw = p.read_bytes()
    try:
        return tomllib.loads(raw.decode("utf-8")), raw
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
    gave is blamed on that ``--set``).

    The result's ``code_trusted`` is True only when the file's bytes are in the operator's trust list
    (``modelward trust allow``); a file that carries the retired ``trust_code`` key is refused, naming what to do
    instead.
    """
    raw_data, raw = _read_toml(path)
    retired = _trust_keys(raw_data) + _trust_keys(apply_overrides({}, overrides))
    if retired:
        raise ConfigError(f"{path}: {retired_trust_key(retired[0], str(path))}")
    data = apply_overrides(raw_data, overrides)
    cfg = validate(model, data, str(path), overrides)
    _mark(cfg, config_allowed(raw), str(path))
    return cfg


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
