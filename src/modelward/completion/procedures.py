"""Retraining procedures T0–T4 (seed 000 §3.3) applied to a trained model with one part missing.

- T0: the reference — every parameter re-initialised (the whole model trained from scratch with the original
  schedule); the part is irrelevant.
- T1: re-initialise the part (glorot uniform), optimise all parameters jointly.
- T2: re-initialise the part, optimise only it; every other parameter stays bit-identical.
- T3: T1 with the part over-parametrised (lottery-ticket motivation): each Linear/Conv2d inside the part is replaced by
  ``two_layers`` (layer → ReLU → layer, hidden width = factor × output width; for conv a k×k conv then a 1×1 conv) or
  ``wider`` (the same factorisation without the non-linearity: the function class is unchanged, only the
  parametrisation is wider).
- T4: T1 with another init scheme (glorot normal, msra, caffe).
"""

from __future__ import annotations

import hashlib

import torch
from torch import nn

from modelward.completion.problem import ProcedureSpec
from modelward.core.init import init_module_
from modelward.core.parts import Part, reset_part_, resolve_part
from modelward.errors import PartError


def stable_seed(*items: object) -> int:
    """A 31-bit seed derived from `items` that is the same in every process (unlike hash())."""
    h = hashlib.sha256("|".join(map(str, items)).encode()).digest()
    return int.from_bytes(h[:4], "little") & 0x7FFFFFFF


#: the part name of the from-scratch reference T0 (it resets everything)
ALL_PARTS = "(all)"


def paired_seeds(seed: int, task: str, part: str) -> tuple[int, int]:
    """(training seed, init seed) of retraining seed `seed` — paired across procedures (issue: "retraining seed i
    uses the same randomness for every procedure"): the training seed (data order, environment seeds, exploration)
    depends only on (seed, task), the init seed of the reset part on (seed, task, part). So T1, T2, T4 and the
    kept/reset-buffer variants of one seed see the same batches and start from the same re-initialised part (T4
    draws its other scheme from the same generator; T3's wider layer from it too)."""
    return stable_seed("retrain", seed, task), stable_seed("retrain-init", seed, task, part)


def _overparam_layer(layer: nn.Module, variant: str, factor: float) -> nn.Module:
    act: nn.Module = nn.ReLU() if variant == "two_layers" else nn.Identity()
    if isinstance(layer, nn.Linear):
        hidden = max(1, int(round(factor * layer.out_features)))
        return nn.Sequential(nn.Linear(layer.in_features, hidden), act,
                             nn.Linear(hidden, layer.out_features, bias=layer.bias is not None))
    if isinstance(layer, nn.Conv2d):
        hidden = max(1, int(round(factor * layer.out_channels)))
        first = nn.Conv2d(layer.in_channels, hidden, layer.kernel_size, layer.stride, layer.padding,
                          layer.dilation, layer.groups if layer.groups == 1 else 1, bias=True)
        return nn.Sequential(first, act, nn.Conv2d(hidden, layer.out_channels, 1, bias=layer.bias is not None))
    raise PartError(f"T3 can over-parametrise Linear and Conv2d layers only, not {type(layer).__name__}")


def overparametrize_(model: nn.Module, part: Part, variant: str, factor: float,
                     generator: torch.Generator | None = None, scheme: str = "glorot_uniform") -> list[str]:
    """Replace every Linear/Conv2d inside `part` by its T3 version (freshly initialised); returns the replaced names."""
    mods = dict(model.named_modules())
    targets = [n for n, m in mods.items() if isinstance(m, nn.Linear | nn.Conv2d)
               and any(f"{n}.{p}" in set(part.params) for p, _ in m.named_parameters(recurse=False))]
    if not targets:
        raise PartError(f"part {part.name!r} has no Linear/Conv2d layer to over-parametrise (T3)")
    for name in targets:
        parent_name, _, attr = name.rpartition(".")
        parent = mods[parent_name] if parent_name else model
        new = _overparam_layer(mods[name], variant, factor)
        init_module_(new, scheme, generator)
        setattr(parent, attr, new)
    return targets


def prepare_retraining(model: nn.Module, part_name: str, procedure: ProcedureSpec,
                       generator: torch.Generator) -> set[str] | None:
    """Reset `part_name` of a trained `model` in place as `procedure` prescribes.

    Returns the parameter names to optimise (T2: the part only) or None (all parameters)."""
    if procedure.kind == "T0":
        init_module_(model, procedure.init, generator)
        for m in model.modules():  # fresh running statistics too: nothing of θ_N survives
            if isinstance(m, nn.modules.batchnorm._BatchNorm) and m.track_running_stats:
                m.reset_running_stats()
        return None
    part = resolve_part(model, part_name)
    reset_part_(model, part, procedure.init, generator)
    if procedure.kind == "T3":
        overparametrize_(model, part, procedure.t3_variant, procedure.t3_factor, generator, procedure.init)
        return None
    if procedure.kind == "T2":
        return set(part.params)
    return None
