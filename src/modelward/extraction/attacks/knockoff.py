"""KnockoffNets query strategies (Orekondy et al. 2019; seed 003 §4.1 "KnockoffNet").

- :class:`KnockoffRandom` — the paper's policy: a fixed-seed random sample of the transfer set (official code:
  shuffle the indices with the seed, take the first `budget`).
- :class:`KnockoffAdaptive` — KnockoffNets' adaptive policy: a gradient bandit over the transfer set's (coarse)
  labels. Each round it samples classes from π = softmax(H), draws unused images of those classes, queries them,
  and rewards the choice by certainty (top-1 − top-2 margin of the answer), diversity (Σ_k max(0, ŷ_k − ȳ_k)
  against the mean of recent answers) and the online substitute's loss on the answer; each reward is
  standardised by its running mean/std. H is updated with the gradient-bandit rule
  H_a ← H_a + α (r − r̄)(1 − π_a), H_b ← H_b − α (r − r̄) π_b (b ≠ a).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from modelward.core.device import model_device
from modelward.extraction.attacks.base import (
    AttackError,
    AttackStrategy,
    Context,
    QueryStrategy,
    seeded_model,
    soft_cross_entropy,
)


class KnockoffRandom(QueryStrategy):
    """Random natural queries from the transfer set (the paper's KnockoffNets setting).

    Args:
        (none): queries are drawn uniformly without replacement from the transfer set, seeded by ``run(seed=...)``.

    Returns:
        A query strategy; combine it with an attack strategy in :class:`ExtractionAttack` (or build both by name
        with :func:`~modelward.extraction.attacks.make_extraction_attack`), whose ``run(...)`` returns an
        :class:`ExtractionResult`.

    Example:
        >>> from modelward.extraction.attacks import make_extraction_attack
        >>> attack = make_extraction_attack("knockoff", "naive")
        >>> type(attack.query).__name__
        'KnockoffRandom'
    """

    name = "knockoff"

    def collect(self, ctx: Context, strategy: AttackStrategy, budget: int) -> tuple[torch.Tensor, torch.Tensor]:
        n = min(budget, len(ctx.transfer))
        idx = torch.randperm(len(ctx.transfer), generator=torch.Generator().manual_seed(ctx.seed))[:n]
        x = ctx.transfer.x[idx]
        return x, strategy.answer(ctx, x)


class KnockoffAdaptive(QueryStrategy):
    """Gradient-bandit selection over the transfer set's labels (KnockoffNets "adaptive" policy).

    Args:
        batch: queries per bandit step.
        alpha: learning rate of the gradient bandit's preferences.
        window: reward baseline window (steps).
        online_lr: learning rate of the substitute's online updates between steps.

    The transfer set must be labelled (the arms are its labels).

    Returns:
        A query strategy; combine it with an attack strategy in :class:`ExtractionAttack` (or build both by name
        with :func:`~modelward.extraction.attacks.make_extraction_attack`), whose ``run(...)`` returns an
        :class:`ExtractionResult`.

    Example:
        >>> from modelward.extraction.attacks import make_extraction_attack
        >>> attack = make_extraction_attack("knockoff_adaptive", "naive", {"batch": 8})
        >>> attack.query.batch
        8
    """

    name = "knockoff_adaptive"

    def __init__(self, batch: int = 16, alpha: float = 0.1, window: int = 64, online_lr: float = 0.05) -> None:
        if batch < 1 or alpha <= 0 or window < 1 or online_lr <= 0:
            raise AttackError("knockoff_adaptive: batch, window >= 1 and alpha, online_lr > 0 required")
        self.batch, self.alpha, self.window, self.online_lr = batch, alpha, window, online_lr
        self.history: list[torch.Tensor] = []  # π after each round (for inspection/tests)

    def collect(self, ctx: Context, strategy: AttackStrategy, budget: int) -> tuple[torch.Tensor, torch.Tensor]:
        if ctx.transfer.y is None:
            raise AttackError("knockoff_adaptive: the transfer set needs (coarse) labels to act on; "
                              "use query='knockoff' for an unlabeled pool")
        g = ctx.generator
        labels = ctx.transfer.y.long()
        actions = torch.unique(labels)
        pools = [labels.eq(a).nonzero().flatten() for a in actions]
        pools = [p[torch.randperm(len(p), generator=g)] for p in pools]
        cursor = [0] * len(pools)
        h = torch.zeros(len(actions))
        r_bar, r_n = 0.0, 0
        stats = torch.zeros(3, 3)  # per reward: count, mean, M2 (Welford)
        online = seeded_model(ctx.substitute_factory, ctx.seed + 7)
        opt = torch.optim.SGD(online.parameters(), lr=self.online_lr, momentum=0.5)
        dev = model_device(online)  # the online model's device; the bandit's statistics stay on the CPU
        xs, ys, recent = [], [], []
        total = min(budget, len(ctx.transfer))
        while sum(len(x) for x in xs) < total:
            avail = torch.tensor([cursor[i] < len(p) for i, p in enumerate(pools)])
            logits = h.masked_fill(~avail, float("-inf"))
            pi = torch.softmax(logits, 0)
            self.history.append(pi.clone())
            want = min(self.batch, total - sum(len(x) for x in xs))
            chosen = torch.multinomial(pi, want, replacement=True, generator=g)
            idx, acts = [], []
            for a in chosen.tolist():
                if cursor[a] < len(pools[a]):
                    idx.append(int(pools[a][cursor[a]]))
                    acts.append(a)
                    cursor[a] += 1
            if not idx:
                continue
            x = ctx.transfer.x[torch.tensor(idx)]
            yhat = strategy.answer(ctx, x)
            with torch.no_grad():
                online.eval()
                loss_r = -(yhat * F.log_softmax(online(x.to(dev)), 1).cpu()).sum(1)
            top2 = yhat.topk(min(2, yhat.shape[1]), dim=1).values
            cert = top2[:, 0] - (top2[:, 1] if top2.shape[1] > 1 else 0.0)
            mean_recent = torch.cat(recent[-self.window:]).mean(0) if recent else torch.zeros(yhat.shape[1])
            div = (yhat - mean_recent).clamp_min(0).sum(1)
            raw = torch.stack([cert, div, loss_r], 1)
            reward = torch.zeros(len(idx))
            for k in range(3):
                for v in raw[:, k].tolist():  # Welford running statistics per reward type
                    stats[k, 0] += 1
                    d = v - stats[k, 1]
                    stats[k, 1] += d / stats[k, 0]
                    stats[k, 2] += d * (v - stats[k, 1])
                std = (stats[k, 2] / stats[k, 0]).sqrt().clamp_min(1e-6)
                reward += (raw[:, k] - stats[k, 1]) / std
            for a, r in zip(acts, reward.tolist(), strict=True):
                r_n += 1
                r_bar += (r - r_bar) / r_n
                step = self.alpha * (r - r_bar)
                h -= step * pi
                h[a] += step
            online.train()
            if len(idx) > 1:
                loss = soft_cross_entropy(online(x.to(dev)), yhat.to(dev))
                opt.zero_grad(set_to_none=True)
                loss.backward()
                opt.step()
            xs.append(x)
            ys.append(yhat)
            recent.append(yhat)
        return torch.cat(xs), torch.cat(ys)
