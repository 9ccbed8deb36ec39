"""Unlearning the reverse-engineered trigger (Wang et al., IEEE S&P 2019, "Neural Cleanse", §VI-C).

The trigger Neural Cleanse reverse-engineered for the suspect class is stamped on a fraction (20 % in the paper) of
the defender's clean images, which keep their *true* labels, and the model is fine-tuned on that set: it learns that
the trigger means nothing. The paper reports the attack success falling to a few percent at a clean-accuracy cost of
under a point.
"""

from __future__ import annotations

import copy
from collections.abc import Callable

import torch
from torch import nn

from modelward.backdoor.mitigate.base import Mitigation
from modelward.backdoor.triggers import Trigger
from modelward.core.modules import batched_logits
from modelward.core.train import TrainConfig, train


def unlearn(model: nn.Module, trigger: Trigger, x_clean: torch.Tensor, y_clean: torch.Tensor, x_val: torch.Tensor,
            y_val: torch.Tensor, *, fraction: float = 0.2, finetune: TrainConfig | None = None, seed: int = 0,
            effect: Callable[[nn.Module], dict] | None = None) -> Mitigation:
    """Fine-tune on clean data of which ``fraction`` carries ``trigger`` with the true labels.

    Args:
        model: the suspect model (not changed; a copy is repaired).
        trigger: the reversed trigger (:meth:`~modelward.backdoor.detect.model.neural_cleanse.ReversedTriggers.trigger`).
        x_clean, y_clean: the defender's clean data; x_val, y_val: held-out clean data for the numbers.
        fraction: the share of rows given the trigger (0.2).
        finetune: the recipe (default: 200 SGD steps, lr 0.01).
        seed: seeds the choice of rows and the fine-tuning.
        effect: ``model -> dict`` for the before/after numbers (default: clean accuracy on the validation data).

    Returns:
        A :class:`Mitigation`.

    Example:
        >>> nc = NeuralCleanse(); v = nc.detect(model, x_clean, 10)  # doctest: +SKIP
        >>> rep = unlearn(model, nc.last.trigger(v.suspect_class), x_clean, y_clean, x_val, y_val)  # doctest: +SKIP
    """
    m = copy.deepcopy(model)
    g = torch.Generator().manual_seed(seed)
    idx = torch.randperm(len(x_clean), generator=g)[: int(round(fraction * len(x_clean)))]
    x = x_clean.clone()
    x[idx] = trigger.apply(x_clean[idx])
    measure = effect or (lambda mod: {"clean_accuracy":
                                      float((batched_logits(mod, x_val).argmax(1) == y_val).float().mean())})
    before = measure(model)
    cfg = finetune or TrainConfig(steps=200, lr=0.01, eval_every=200, batch_size=64)
    train(m, x, y_clean, x_val, y_val, cfg, seed)
    m.eval()
    return Mitigation("unlearning", m, before, measure(m),
                      {"fraction": fraction, "rows_with_trigger": len(idx), "finetune_steps": cfg.steps,
                       "trigger": trigger.to_dict()})
