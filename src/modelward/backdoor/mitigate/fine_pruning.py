"""Fine-pruning (Liu, Dolan-Gavitt & Garg, RAID 2018, "Fine-Pruning: Defending Against Backdooring Attacks on Deep
Neural Networks", §4).

Backdoor behaviour tends to live in neurons that clean inputs leave dormant. The channels of the last
convolutional layer are pruned in increasing order of their mean activation on clean data, as long as the clean
accuracy on a validation split stays within ``max_drop`` of the original (the paper prunes until the validation
accuracy falls by a set amount); the pruned model is then fine-tuned on the clean data, with the pruned channels
held at zero. Pruning is made permanent by zeroing the channel's BatchNorm scale and shift (or, without BatchNorm,
its convolution filter and bias), so the saved model is the original architecture.
"""

from __future__ import annotations

import copy
from collections.abc import Callable

import torch
from torch import nn

from modelward.backdoor.attacks.base import backdoor_effect
from modelward.backdoor.features import channel_activity, channel_mask, last_feature_map
from modelward.backdoor.mitigate.base import Mitigation
from modelward.core.modules import batched_logits
from modelward.core.train import TrainConfig, train
from modelward.errors import ConfigError


def _accuracy(model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> float:
    return float((batched_logits(model, x).argmax(1) == y).float().mean())


def _zero_channels(block: nn.Module, pruned: torch.Tensor) -> None:
    bns = [m for m in block.modules() if isinstance(m, nn.BatchNorm2d) and m.num_features == len(pruned)]
    with torch.no_grad():
        if bns:
            bns[-1].weight[pruned] = 0.0
            bns[-1].bias[pruned] = 0.0
            return
        convs = [m for m in block.modules() if isinstance(m, nn.Conv2d) and m.out_channels == len(pruned)]
        if not convs:
            raise ConfigError("fine_pruning: the last feature map's block has no BatchNorm2d or Conv2d with as many "
                              "channels; give `layer` explicitly")
        convs[-1].weight[pruned] = 0.0
        if convs[-1].bias is not None:
            convs[-1].bias[pruned] = 0.0


def fine_prune(model: nn.Module, x_clean: torch.Tensor, y_clean: torch.Tensor, x_val: torch.Tensor,
               y_val: torch.Tensor, *, max_drop: float = 0.05, finetune: TrainConfig | None = None,
               layer: str | None = None, seed: int = 0,
               effect: Callable[[nn.Module], dict] | None = None) -> Mitigation:
    """Prune the dormant channels of the last convolutional layer, then fine-tune on clean data.

    Args:
        model: the suspect model (not changed; a copy is repaired).
        x_clean, y_clean: clean data the defender holds (fine-tuning and the activation ranking).
        x_val, y_val: clean validation data (the accuracy that stops the pruning).
        max_drop: the validation accuracy may fall by at most this much while pruning.
        finetune: the fine-tuning recipe (default: 100 SGD steps, lr 0.01).
        layer: the module whose output channels are pruned (default: the last 4-D feature map).
        seed: seeds the fine-tuning.
        effect: ``model -> BackdoorEffect.to_dict()`` for the before/after numbers (default: clean accuracy on the
            validation data only).

    Returns:
        A :class:`Mitigation` (``details``: the layer, pruned channels, accuracy after pruning).

    Example:
        >>> rep = fine_prune(model, x_clean, y_clean, x_val, y_val)  # doctest: +SKIP
        >>> rep.after["attack_success_rate"]  # doctest: +SKIP
    """
    m = copy.deepcopy(model).eval()
    layer = layer or last_feature_map(m, x_clean)
    block = dict(m.named_modules()).get(layer)
    if block is None:
        raise ConfigError(f"fine_pruning: no module named {layer!r} in the model")
    measure = effect or (lambda mod: {"clean_accuracy": _accuracy(mod, x_val, y_val)})
    before = measure(model)
    base_acc = _accuracy(m, x_val, y_val)
    activity = channel_activity(m, layer, x_clean)
    order = torch.argsort(activity)
    keep = torch.ones(len(activity))
    pruned: list[int] = []
    for ch in order.tolist():
        keep[ch] = 0.0
        with channel_mask(m, layer, keep):
            acc = _accuracy(m, x_val, y_val)
        if acc < base_acc - max_drop or len(pruned) + 1 >= len(activity):
            keep[ch] = 1.0
            break
        pruned.append(ch)
    with channel_mask(m, layer, keep):
        acc_pruned = _accuracy(m, x_val, y_val)
        cfg = finetune or TrainConfig(steps=100, lr=0.01, eval_every=100, batch_size=64)
        train(m, x_clean, y_clean, x_val, y_val, cfg, seed)
    mask = keep == 0
    _zero_channels(block, mask)
    m.eval()
    return Mitigation("fine_pruning", m, before, measure(m),
                      {"layer": layer, "channels": len(activity), "pruned": pruned,
                       "accuracy_after_pruning": acc_pruned, "finetune_steps": cfg.steps})


def effect_of(apply: Callable[[torch.Tensor], torch.Tensor], x: torch.Tensor, y: torch.Tensor, target: int
              ) -> Callable[[nn.Module], dict]:
    """``model -> clean accuracy and ASR`` on ``(x, y)`` with the trigger ``apply`` (for ``effect=``)."""
    return lambda model: backdoor_effect(model, apply, x, y, target).to_dict()
