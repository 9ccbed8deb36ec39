"""Model parts: disjoint parameter groups addressed by module name or glob (seed 000 §3: θ = [θ¹, θ²]).

A part name is one of
- a module name: ``conv1``, ``layer4.0``, ``fc1`` (all parameters and buffers under that module);
- a glob over module names: ``classifier.*``, ``layer*.0`` (the union of the matching modules);
- a module name with the suffix ``-W``: a residual block *without* its ``shortcut`` (the paper's "S4 B1 -W");
- a union of the above joined by ``+``: ``conv2+fc1+logits`` (e.g. everything one party of a split holds).
"""

from __future__ import annotations

import fnmatch
from dataclasses import dataclass

import torch
from torch import nn

from modelward.core.init import init_module_
from modelward.errors import PartError

_NORM_TYPES = (nn.BatchNorm1d, nn.BatchNorm2d, nn.BatchNorm3d, nn.LayerNorm, nn.GroupNorm)


@dataclass(frozen=True)
class Part:
    """A resolved part: the full names of its parameters and buffers."""

    name: str
    params: tuple[str, ...]
    buffers: tuple[str, ...]
    modules: tuple[str, ...]

    def num_parameters(self, model: nn.Module) -> int:
        p = dict(model.named_parameters())
        return sum(p[n].numel() for n in self.params)

    def num_parameters_excluding_norm(self, model: nn.Module) -> int:
        """Weights + biases without normalisation layers (App. B's AlexNet table counts these)."""
        mods = dict(model.named_modules())
        p = dict(model.named_parameters())
        total = 0
        for n in self.params:
            owner = n.rsplit(".", 1)[0] if "." in n else ""
            if not isinstance(mods.get(owner), _NORM_TYPES):
                total += p[n].numel()
        return total


def default_part_names(model: nn.Module) -> list[str]:
    """The model's natural parts, lower to higher layers: ``model.part_names`` if it has one, else its
    parameterised top-level children (containers expanded one level)."""
    names = getattr(model, "part_names", None)
    if names:
        return list(names)
    out: list[str] = []
    for name, child in model.named_children():
        if not any(True for _ in child.parameters()):
            continue
        if isinstance(child, nn.Sequential | nn.ModuleList) and len(child) > 1:
            out += [f"{name}.{n}" for n, c in child.named_children() if any(True for _ in c.parameters())]
        else:
            out.append(name)
    return out


def _module_names(model: nn.Module) -> list[str]:
    return [n for n, _ in model.named_modules() if n]


def valid_part_names(model: nn.Module) -> list[str]:
    """Module names that own parameters (what a user can type), natural parts first."""
    natural = default_part_names(model)
    rest = [n for n, m in model.named_modules() if n and any(True for _ in m.parameters()) and n not in natural]
    return natural + rest


def resolve_part(model: nn.Module, name: str) -> Part:
    """Resolve `name` to a Part, or raise PartError listing the valid names."""
    if "+" in name:
        pieces = [resolve_part(model, n.strip()) for n in name.split("+") if n.strip()]
        params = tuple(dict.fromkeys(p for piece in pieces for p in piece.params))
        buffers = tuple(dict.fromkeys(b for piece in pieces for b in piece.buffers))
        modules = tuple(dict.fromkeys(m for piece in pieces for m in piece.modules))
        return Part(name, params, buffers, modules)
    mods = dict(model.named_modules())
    without_shortcut = name.endswith("-W")
    base = name[:-2] if without_shortcut else name
    if any(ch in base for ch in "*?["):
        matched = [n for n in _module_names(model) if fnmatch.fnmatchcase(n, base)]
        # keep only top-most matches so a module is not counted twice
        matched = [n for n in matched if not any(n != m and n.startswith(m + ".") for m in matched)]
    else:
        matched = [base] if base in mods and base else []
    if not matched:
        choices = valid_part_names(model)
        shown = ", ".join(choices[:40]) + (" ..." if len(choices) > 40 else "")
        raise PartError(f"unknown part {name!r}; valid parts: {shown}")
    if without_shortcut:
        for m in matched:
            if not hasattr(mods[m], "shortcut"):
                raise PartError(f"part {name!r}: '-W' needs a residual block with a 'shortcut'; {m!r} has none")
    params, buffers = [], []
    for pn, _ in model.named_parameters():
        if _inside(pn, matched, without_shortcut):
            params.append(pn)
    for bn, _ in model.named_buffers():
        if _inside(bn, matched, without_shortcut):
            buffers.append(bn)
    if not params:
        raise PartError(f"part {name!r} has no parameters")
    return Part(name, tuple(params), tuple(buffers), tuple(matched))


def _inside(full: str, roots: list[str], without_shortcut: bool) -> bool:
    for r in roots:
        if full.startswith(r + "."):
            if without_shortcut and full.startswith(r + ".shortcut."):
                return False
            return True
    return False


def parts_table(model: nn.Module, names: list[str] | None = None) -> list[dict[str, object]]:
    """Rows of (part, parameters, parameters excluding normalisation layers) — App. B's tables."""
    rows = []
    for n in names or default_part_names(model):
        p = resolve_part(model, n)
        rows.append({"part": n, "params": p.num_parameters(model),
                     "params_excl_norm": p.num_parameters_excluding_norm(model)})
    total = sum(p.numel() for p in model.parameters())
    rows.append({"part": "total", "params": total, "params_excl_norm": None})
    return rows


@torch.no_grad()
def reset_part_(model: nn.Module, part: Part | str, scheme: str = "glorot_uniform",
                generator: torch.Generator | None = None) -> Part:
    """Re-initialise only `part`'s parameters (and its norm layers' running statistics) with `scheme`."""
    if isinstance(part, str):
        part = resolve_part(model, part)
    wanted = set(part.params)
    init_module_(model, scheme, generator, param_filter=wanted)
    # running statistics of BN layers inside the part start afresh, like a new layer would
    for mname, m in model.named_modules():
        if isinstance(m, nn.modules.batchnorm._BatchNorm) and m.track_running_stats:
            if f"{mname}.weight" in wanted or f"{mname}.running_mean" in set(part.buffers):
                m.reset_running_stats()
    return part
