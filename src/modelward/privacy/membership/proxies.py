"""Proxy tops (seed 002 Alg. 8.1 / 8.3): copies of the target's top g trained on the target's own features ĥ(x).

Shared by bayesian-wb, nn-wb and the deep attack, cached in :attr:`AttackData.cache` so one audit trains them once.
"""

from __future__ import annotations

import numpy as np
import torch

from modelward.core.init import init_module_
from modelward.core.io import load_state_dict, save_state_dict
from modelward.privacy.membership.base import AttackData
from modelward.privacy.shadows import fit, train_stacked
from modelward.privacy.slicing import Side, Top, features, get_layer, last_linear


def train_tops(data: AttackData, x: torch.Tensor, y: torch.Tensor, layer: str, count: int, bootstrap: bool,
               seed: int, target: torch.nn.Module | None = None, side: Side = "input") -> list[Top]:
    """``count`` proxy tops of ``target`` (default the attacked model) sliced at ``layer``, trained with the
    target's algorithm on ĥ(x) of bootstrap samples (or the whole of) ``x``."""
    rng = np.random.default_rng(seed)
    sets = [rng.integers(0, len(x), len(x)) if bootstrap else np.arange(len(x)) for _ in range(count)]
    return train_tops_on(data, x, y, layer, sets, [seed * 7919 + k for k in range(count)], target, side)


def train_tops_on(data: AttackData, x: torch.Tensor, y: torch.Tensor, layer: str, sets: list[np.ndarray],
                  seeds: list[int], target: torch.nn.Module | None = None, side: Side = "input") -> list[Top]:
    """One top per index set ``sets[k]`` of ``x`` (seed ``seeds[k]``); a linear top trains stacked (exact)."""
    trainer = data.need_trainer("proxy training")
    net = data.target if target is None else target
    z = features(net, layer, x, side)
    ref = Top.of(net, layer, x[:1], side)
    tops = []
    lin = get_layer(net, layer)
    if side == "input" and layer == last_linear(net) and isinstance(lin, torch.nn.Linear) and lin.bias is not None:
        # the top is one linear layer: train all proxies as stacked nn.Linear models (exact, much faster)
        lins = []
        for sd in seeds:
            m = torch.nn.Linear(lin.in_features, lin.out_features)
            init_module_(m, trainer.init_scheme, torch.Generator().manual_seed(sd))
            lins.append(m)
        train_stacked(lins, z, y, sets, trainer.cfg, seeds)
        for m in lins:
            top = ref.fresh_copy(torch.Generator().manual_seed(0))
            with torch.no_grad():
                get_layer(top.model, layer).weight.copy_(m.weight)
                get_layer(top.model, layer).bias.copy_(m.bias)
            tops.append(top.eval())
        return tops
    for ix, sd in zip(sets, seeds, strict=True):
        idx = torch.as_tensor(ix)
        top = ref.fresh_copy(torch.Generator().manual_seed(sd))
        trainable = {f"model.{n}" for n, _ in top.after_params()}
        fit(top, z[idx], y[idx], trainer.cfg, sd, trainable=trainable)
        tops.append(top)
    return tops


def cached_tops(data: AttackData, layer: str | None, count: int, bootstrap: bool) -> tuple[str, list[Top]]:
    """The target's proxy tops on the hold-out data (trained once per (layer, count, bootstrap))."""
    layer = layer or last_linear(data.target)
    key = f"proxies:{layer}:{count}:{bootstrap}"
    if key not in data.cache:
        data.cache[key] = train_tops(data, data.x_aux, data.y_aux, layer, count, bootstrap, data.seed)
    return layer, data.cache[key]


def save_tops(path: str, tops_by_key: dict[str, list[Top]], layer: str) -> None:
    """Save proxy tops of the last linear layer (only its weight and bias are trained) as safetensors."""
    tensors = {}
    for key, tops in tops_by_key.items():
        for k, t in enumerate(tops):
            lin = get_layer(t.model, layer)
            tensors[f"{key}|{k}|weight"] = lin.weight.detach()
            tensors[f"{key}|{k}|bias"] = lin.bias.detach()
    save_state_dict(path, tensors, {"layer": layer, "keys": list(tops_by_key)})


def load_tops(path: str, data: AttackData) -> None:
    """Put the saved proxy tops into ``data.cache`` (as :func:`cached_tops` would have trained them)."""
    tensors, meta = load_state_dict(path)
    layer = meta["layer"]
    ref = Top.of(data.target, layer, data.x_aux[:1])
    for key in meta["keys"]:
        tops = []
        k = 0
        while f"{key}|{k}|weight" in tensors:
            top = ref.fresh_copy(torch.Generator().manual_seed(0))
            with torch.no_grad():
                get_layer(top.model, layer).weight.copy_(tensors[f"{key}|{k}|weight"])
                get_layer(top.model, layer).bias.copy_(tensors[f"{key}|{k}|bias"])
            tops.append(top.eval())
            k += 1
        data.cache[key] = tops
