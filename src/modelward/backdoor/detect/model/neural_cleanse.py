"""Neural Cleanse (Wang, Yao, Shan, Li, Viswanath, Zheng & Zhao, IEEE S&P 2019, "Neural Cleanse: Identifying and
Mitigating Backdoor Attacks in Neural Networks", §IV).

For every class t, find the smallest trigger — a mask m ∈ [0, 1]^{H×W} and a pattern p — that sends clean inputs to
t (eq. 2–3):

    min_{m, p}  CE(f((1 − m)·x + m·p), t) + λ·‖m‖₁

with m and p parametrised through tanh (so they stay in their box), Adam (lr 0.1, β = (0.5, 0.9)) and the paper's
adaptive λ: λ starts at ``init_cost``; after ``patience`` epochs whose attack success is ≥ ``success_threshold``
(0.99) it is multiplied by 1.5, after ``patience`` epochs below it divided by 1.5^1.5; the best mask is the
smallest one reaching the threshold; an epoch is a pass over the clean images. A backdoored class needs a much
smaller trigger than the others: with the L1 norms ℓ_t, the anomaly index of the smallest is

    AI = (median(ℓ) − min(ℓ)) / (1.4826 · MAD(ℓ))

and the model is flagged when AI > 2 (the paper's threshold: > 95 % probability of being an outlier under a
normal model of the norms). Only norms below the median count (a backdoor makes a trigger smaller, never larger).

The K classes are optimised side by side (one forward pass carries every class's triggered batch), each with its own
λ schedule and early stop: the same optimisation as K separate runs (Adam's state is per parameter), at the cost
of one Python loop.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from modelward.backdoor.detect.model.base import ModelVerdict
from modelward.backdoor.triggers import MaskTrigger
from modelward.core.modules import eval_mode, model_device
from modelward.errors import ConfigError

_EPS = 1e-7


@dataclass(frozen=True)
class ReversedTriggers:
    """The smallest trigger found per class.

    Attributes:
        masks: ``K×1×H×W``; patterns: ``K×C×H×W``; l1: the masks' L1 norms; success: the clean images' rate of
        reaching each class with its trigger (in the epoch the mask was kept); epochs: epochs run.
    """

    masks: torch.Tensor
    patterns: torch.Tensor
    l1: torch.Tensor
    success: torch.Tensor
    epochs: int

    def trigger(self, cls: int, clip: tuple[float, float] = (0.0, 1.0)) -> MaskTrigger:
        """Class ``cls``'s reversed trigger, usable like an attack's (``.apply(x)``)."""
        return MaskTrigger(self.masks[cls], self.patterns[cls], clip)


def anomaly_index(norms: np.ndarray | list[float]) -> tuple[float, int]:
    """The anomaly index of the smallest norm (0 when it is not below the median) and its class.

    Example:
        >>> round(anomaly_index([10, 11, 9, 10, 12, 10, 2, 11, 10, 9])[0], 2)
        5.4
    """
    v = np.asarray(norms, dtype=np.float64)
    med = float(np.median(v))
    mad = 1.4826 * float(np.median(np.abs(v - med)))
    k = int(np.argmin(v))
    if mad <= 0:
        return (float("inf") if v[k] < med else 0.0), k
    return max(0.0, (med - float(v[k])) / mad), k


class NeuralCleanse:
    """Trigger reverse-engineering and the MAD outlier test over classes.

    Args:
        epochs: the most epochs (passes over the clean images) per class.
        batch_size: clean images per step.
        lr: Adam's learning rate (β = (0.5, 0.9), as the paper's code).
        init_cost: the first λ.
        success_threshold: the attack success a kept trigger must reach (0.99).
        patience: epochs before λ moves; early_stop_patience: epochs without a 1 % smaller mask before a class
            stops (once λ has gone both up and down).
        threshold: the anomaly index above which the model is flagged (2).
        seed: seeds the initial masks and the batches.
        clip: the input box.

    Returns:
        A detector: ``detect(model, x_clean, num_classes)`` → :class:`ModelVerdict` (anomaly index), ``reverse``
        → the per-class triggers (also kept as ``last`` after ``detect``).

    Example:
        >>> verdict = NeuralCleanse(epochs=20).detect(model, x_clean, num_classes=10)  # doctest: +SKIP
        >>> verdict.backdoored, verdict.suspect_class, verdict.statistic  # doctest: +SKIP
    """

    name = "neural_cleanse"

    def __init__(self, epochs: int = 40, batch_size: int = 32, lr: float = 0.1, init_cost: float = 1e-3,
                 success_threshold: float = 0.99, patience: int = 5, early_stop_patience: int = 10,
                 threshold: float = 2.0, seed: int = 0, clip: tuple[float, float] = (0.0, 1.0)) -> None:
        if epochs < 1 or batch_size < 1:
            raise ConfigError("neural_cleanse: epochs and batch_size must be ≥ 1")
        self.epochs, self.batch_size, self.lr, self.init_cost = epochs, batch_size, lr, init_cost
        self.success_threshold, self.patience, self.early_stop_patience = success_threshold, patience, \
            early_stop_patience
        self.threshold, self.seed, self.clip = threshold, seed, tuple(clip)

    def reverse(self, model: nn.Module, x: torch.Tensor, num_classes: int) -> ReversedTriggers:
        """The smallest trigger of every class from the clean images ``x`` (``N×C×H×W``)."""
        if x.dim() != 4:
            raise ConfigError(f"neural_cleanse: needs images N×C×H×W, got shape {tuple(x.shape)}")
        dev = model_device(model)
        k = num_classes
        _, c, h, w = x.shape
        lo, hi = self.clip
        g = torch.Generator().manual_seed(self.seed)
        m_raw = torch.atanh((torch.rand(k, 1, h, w, generator=g) * 2 - 1) * 0.99).to(dev).requires_grad_(True)
        p_raw = torch.atanh((torch.rand(k, c, h, w, generator=g) * 2 - 1) * 0.99).to(dev).requires_grad_(True)
        opt = torch.optim.Adam([m_raw, p_raw], lr=self.lr, betas=(0.5, 0.9))
        targets = torch.arange(k, device=dev)
        cost = torch.full((k,), self.init_cost, device=dev)
        best_mask = torch.zeros(k, 1, h, w)
        best_pat = torch.zeros(k, c, h, w)
        best_reg = torch.full((k,), float("inf"))
        best_acc = torch.zeros(k)
        up = torch.zeros(k, dtype=torch.long)
        down = torch.zeros(k, dtype=torch.long)
        up_flag = torch.zeros(k, dtype=torch.bool)
        down_flag = torch.zeros(k, dtype=torch.bool)
        stop_count = torch.zeros(k, dtype=torch.long)
        stop_best = torch.full((k,), float("inf"))
        active = torch.ones(k, dtype=torch.bool)
        xd = x.to(dev)
        epochs = 0
        with eval_mode(model, frozen_params=True):
            for _ in range(self.epochs):
                epochs += 1
                order = torch.randperm(len(x), generator=g)
                acc_sum = torch.zeros(k)
                reg_sum = torch.zeros(k)
                nb = 0
                for i in range(0, len(x), self.batch_size):
                    xb = xd[order[i:i + self.batch_size].to(dev)]
                    mask = torch.tanh(m_raw) / (2 - _EPS) + 0.5
                    pat = lo + (hi - lo) * (torch.tanh(p_raw) / (2 - _EPS) + 0.5)
                    xa = (1 - mask[:, None]) * xb[None] + mask[:, None] * pat[:, None]  # K×B×C×H×W
                    logits = model(xa.flatten(0, 1)).view(k, len(xb), -1)
                    ce = F.cross_entropy(logits.flatten(0, 1), targets.repeat_interleave(len(xb)),
                                         reduction="none").view(k, -1).mean(1)
                    reg = mask.flatten(1).sum(1)
                    loss = ((ce + cost * reg) * active.to(dev)).sum()
                    opt.zero_grad(set_to_none=True)
                    loss.backward()
                    opt.step()
                    acc_sum += (logits.argmax(2) == targets[:, None]).float().mean(1).detach().cpu()
                    reg_sum += reg.detach().cpu()
                    nb += 1
                acc, reg_e = acc_sum / nb, reg_sum / nb
                with torch.no_grad():
                    mask = (torch.tanh(m_raw) / (2 - _EPS) + 0.5).cpu()
                    pat = (lo + (hi - lo) * (torch.tanh(p_raw) / (2 - _EPS) + 0.5)).cpu()
                ok = acc >= self.success_threshold
                better = ok & (reg_e < best_reg) & active
                best_mask[better], best_pat[better] = mask[better], pat[better]
                best_reg[better], best_acc[better] = reg_e[better], acc[better]
                # early stop (the paper's code): no 1 % improvement for early_stop_patience epochs, λ moved both ways
                found = torch.isfinite(best_reg)
                stalled = found & (best_reg >= 0.99 * stop_best)
                stop_count = torch.where(stalled, stop_count + 1, torch.where(found, 0, stop_count))
                stop_best = torch.minimum(stop_best, best_reg)
                active &= ~(up_flag & down_flag & (stop_count >= self.early_stop_patience))
                # λ schedule
                up = torch.where(ok, up + 1, 0)
                down = torch.where(ok, 0, down + 1)
                raise_ = up >= self.patience
                lower = (~raise_) & (down >= self.patience)
                cost = torch.where(raise_.to(dev), cost * 1.5, torch.where(lower.to(dev), cost / 1.5 ** 1.5, cost))
                up = torch.where(raise_, 0, up)
                down = torch.where(lower, 0, down)
                up_flag |= raise_
                down_flag |= lower
                if not bool(active.any()):
                    break
        never = ~torch.isfinite(best_reg)  # never reached the threshold: keep the last mask (as the paper's code)
        if bool(never.any()):
            with torch.no_grad():
                mask = (torch.tanh(m_raw) / (2 - _EPS) + 0.5).cpu()
                pat = (lo + (hi - lo) * (torch.tanh(p_raw) / (2 - _EPS) + 0.5)).cpu()
            best_mask[never], best_pat[never] = mask[never], pat[never]
        l1 = best_mask.flatten(1).sum(1)
        return ReversedTriggers(best_mask, best_pat, l1, best_acc, epochs)

    def detect(self, model: nn.Module, x: torch.Tensor, num_classes: int) -> ModelVerdict:
        """Reverse-engineer every class's trigger on the clean images ``x`` and test the smallest for an outlier.

        Returns:
            A :class:`ModelVerdict` with the anomaly index as statistic and the per-class L1 norms; ``extra``
            holds ``success`` per class and the epochs run.
        """
        t0 = time.perf_counter()
        rev = self.reverse(model, x, num_classes)
        norms = rev.l1.tolist()
        ai, k = anomaly_index(norms)
        self.last = rev
        return ModelVerdict(self.name, float(ai), self.threshold, bool(ai > self.threshold), k, norms,
                            seconds=time.perf_counter() - t0,
                            extra={"success": rev.success.tolist(), "epochs": rev.epochs})
