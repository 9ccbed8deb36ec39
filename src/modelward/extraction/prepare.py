"""What every cell of an extraction evaluation shares: the data split, the (cached) victim, its temperature, AM's
misinformation model, the attacker's transfer pool and the eval set (seed 003 §4.1; digest §13.3).

The victim is trained here (cached per configuration under ``victim.cache_dir``), optionally temperature-scaled
(softmax(z/T): a less confident victim), and served to cells locally or through the guarded HTTP service.
"""

from __future__ import annotations

import copy
import hashlib
import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

from modelward.core.data import DataSplit, load_data
from modelward.core.device import resolve_device
from modelward.core.io import load_into, load_state_dict, save_state_dict
from modelward.core.progress import ProgressSink, as_sink
from modelward.core.train import train
from modelward.core.zoo import ModelConfig, build_model
from modelward.errors import ConfigError
from modelward.extraction.attacks import EvalSet, TransferSet, knowledge_from_defense
from modelward.extraction.attacks.base import AttackKnowledge, seeded_model
from modelward.extraction.attacks.s4l import last_linear
from modelward.extraction.config import DefenseSpec, ExtractionConfig
from modelward.extraction.defenses import IncrementalState, PredictionDefense, build_defense, make_defense
from modelward.extraction.defenses.adaptive_misinformation import train_misinformation_model


class Tempered(nn.Module):
    """Logits divided by a temperature T, so the served softmax is softmax(z / T) (a less confident victim)."""

    def __init__(self, model: nn.Module, temperature: float) -> None:
        super().__init__()
        self.model, self.temperature = model, float(temperature)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.model(x) / self.temperature


@dataclass
class Prepared:
    """Everything the cells share: data split, trained victim, attacker pool, eval set."""

    data: DataSplit
    victim: nn.Module  # tempered
    victim_accuracy: float
    transfer: TransferSet
    eval_set: EvalSet
    substitute_factory: Callable[[], nn.Module]
    misinformation: nn.Module | None
    cached: bool
    model_cfg: ModelConfig


def _cfg_hash(obj: Any) -> str:
    return hashlib.sha256(json.dumps(obj, sort_keys=True, default=str).encode()).hexdigest()[:16]


def _split_victim(cfg: ExtractionConfig, data: DataSplit) -> tuple[torch.Tensor, torch.Tensor]:
    """Seeded permutation of the train split: the victim's indices and the attacker pool's indices."""
    n = len(data.x_train)
    perm = torch.randperm(n, generator=torch.Generator().manual_seed(cfg.victim.seed + 1))
    k = max(1, min(n - 1, int(round(n * cfg.victim.victim_fraction))))
    return perm[:k], perm[k:]


def prepare(cfg: ExtractionConfig, progress: ProgressSink | None = None) -> Prepared:
    """Load data, train (or load from cache) the victim, build the attacker pool and the eval set.

    Training the victim is reported to `progress` under the key ``"victim"``.
    """
    data = load_data(cfg.data)
    vidx, pidx = _split_victim(cfg, data)
    arch = cfg.victim.model
    key = _cfg_hash({"data": cfg.data.model_dump(mode="json"), "model": arch.model_dump(mode="json"),
                     "train": cfg.victim.train.model_dump(mode="json"), "frac": cfg.victim.victim_fraction,
                     "seed": cfg.victim.seed, "am": cfg.victim.misinformation_steps,
                     "am_needed": any(d.name == "adaptive_misinformation" for d in cfg.defenses)})
    cache = Path(cfg.victim.cache_dir).expanduser() / key

    def factory() -> nn.Module:
        return build_model(arch, data.input_shape, data.num_classes)

    base = seeded_model(factory, cfg.victim.seed)
    need_am = any(d.name == "adaptive_misinformation" for d in cfg.defenses)
    mis = seeded_model(factory, cfg.victim.seed + 5) if need_am else None
    cached = (cache / "victim.safetensors").is_file() and (not need_am or (cache / "misinfo.safetensors").is_file())
    if cached:
        state, _ = load_state_dict(cache / "victim.safetensors")
        load_into(base, state, cache / "victim.safetensors")
        if mis is not None:
            load_into(mis, load_state_dict(cache / "misinfo.safetensors")[0], cache / "misinfo.safetensors")
    else:
        sink = as_sink(progress)
        sink.start("victim", None, f"training the victim ({arch.arch}, {cfg.victim.train.steps} steps)")

        base.to(resolve_device(cfg.device))  # trained on the device, then served and defended from the CPU
        train(base, data.x_train[vidx], data.y_train[vidx], data.x_test, data.y_test, cfg.victim.train,
              seed=cfg.victim.seed)
        base.cpu()
        save_state_dict(cache / "victim.safetensors", base.state_dict(), {"config": key})
        if mis is not None:
            train_misinformation_model(mis, data.x_train[vidx], data.y_train[vidx], cfg.victim.misinformation_steps,
                                       seed=cfg.victim.seed + 6)
            save_state_dict(cache / "misinfo.safetensors", mis.state_dict(), {"config": key})
        sink.done("victim")
    base.eval()
    victim = Tempered(base, cfg.victim.temperature).eval()
    with torch.no_grad():
        vlab = victim(data.x_test).argmax(1)
    vacc = (vlab == data.y_test).float().mean().item()
    transfer = _transfer(cfg, data, pidx)
    if cfg.budget > len(transfer):
        raise ConfigError(f"budget: {cfg.budget} exceeds the transfer pool ({len(transfer)} inputs); lower budget "
                          "or enlarge the pool (transfer.size / victim.victim_fraction)")
    sub_arch = cfg.substitute_model or arch
    return Prepared(data, victim, vacc, transfer, EvalSet(data.x_test, data.y_test, vlab),
                    lambda: build_model(sub_arch, data.input_shape, data.num_classes), mis, cached, arch)


def _transfer(cfg: ExtractionConfig, data: DataSplit, pidx: torch.Tensor) -> TransferSet:
    t = cfg.transfer
    if t.source == "pool":
        return TransferSet(data.x_train[pidx], data.y_train[pidx])
    if t.source == "noise":
        g = torch.Generator().manual_seed(t.seed)
        return TransferSet(torch.rand((t.size, *data.input_shape), generator=g))
    assert t.data is not None
    other = load_data(t.data)
    if other.input_shape != data.input_shape:
        raise ConfigError(f"transfer.data: inputs have shape {list(other.input_shape)}, the victim expects "
                          f"{list(data.input_shape)}")
    return TransferSet(other.x_train, other.y_train)


def defense_models(prep: Prepared, seed: int) -> dict[str, Callable[[], nn.Module | None]]:
    """The models a defense may declare in ``needs``, for :func:`~modelward.extraction.defenses.build_defense`.

    MAD's G comes from a randomly initialised surrogate of the victim's architecture (digest §7), seeded per cell;
    AdaptiveMisinformation's misinformation model is the one trained once for the study.
    """
    return {"surrogate": lambda: seeded_model(prep.substitute_factory, 10_000 + seed).eval(),
            "misinformation": lambda: prep.misinformation}


def cell_defense(spec: DefenseSpec, epsilon: float | None, prep: Prepared, seed: int) -> PredictionDefense:
    """A fresh defense instance (stateful defenses start empty for every cell, as separate runs in the paper)."""
    overrides = {} if epsilon is None else {"epsilon": epsilon}
    return build_defense(spec, defense_models(prep, seed), **overrides)


def clean_fn(model: nn.Module) -> Callable[[torch.Tensor], torch.Tensor]:
    """The victim's clean answers softmax(model(x)), in batches of 512, without gradients."""

    @torch.no_grad()
    def clean(x: torch.Tensor) -> torch.Tensor:
        return torch.cat([torch.softmax(model(x[i : i + 512]), 1) for i in range(0, len(x), 512)])

    return clean


def centroid_count(defense: PredictionDefense) -> int | None:
    """Number of ModelGuard-S centroids (None for defenses without :class:`IncrementalState`)."""
    return int(defense.num_centroids) if isinstance(defense, IncrementalState) else None


def fold_temperature(victim: nn.Module) -> nn.Module:
    """A plain zoo model computing z / T: the temperature folded into the output Linear layer (for serving)."""
    if not isinstance(victim, Tempered):
        return copy.deepcopy(victim)
    model = copy.deepcopy(victim.model)
    if victim.temperature != 1.0:
        lin = last_linear(model)
        with torch.no_grad():
            lin.weight.div_(victim.temperature)
            if lin.bias is not None:
                lin.bias.div_(victim.temperature)
    return model


def centroid_curves(cfg: ExtractionConfig, prep: Prepared, every: int = 25) -> dict[str, tuple[list[int], list[int]]]:
    """ModelGuard-S centroid count vs number of queries (KnockoffNets order over the pool; Fig. 5 right)."""
    clean = clean_fn(prep.victim)
    n = min(len(prep.transfer), max(cfg.budget, 1))
    idx = torch.randperm(len(prep.transfer), generator=torch.Generator().manual_seed(cfg.seeds[0]))[:n]
    y = clean(prep.transfer.x[idx])
    curves = {}
    for eps in cfg.centroid_epsilons:
        s = make_defense("modelguard_s", epsilon=eps)
        xs, cs = [0], [0]
        for i in range(0, n, every):
            s.defend(y[i : i + every])
            xs.append(min(i + every, n))
            cs.append(centroid_count(s) or 0)
        curves[f"ε={eps:g}"] = (xs, cs)
    return curves


def knowledge_for_local(defense: PredictionDefense, model: nn.Module) -> AttackKnowledge:
    """Convenience for library users: the adaptive attacker's knowledge of a local victim (model + defense)."""
    return knowledge_from_defense(defense, clean_fn(model))
