"""D-DAE and D-DAE+ attacks (Chen et al. [8]; seed 003 §4.1; official ``Recover_NN``, digest §6.2).

A restorer network r maps a perturbed answer ŷ back to a clean prediction y; the substitute is trained on r(Ŷ).
- D-DAE: r is trained on {(p(f_i(x)), f_i(x)) : x ∈ X_q, i = 1..S} from S shadow models, each trained on a random
  class subset of the attacker's labelled pool (official: C random classes, relabelled 0..C−1). The defense
  detector of D-DAE is omitted because the attacker knows the defense.
- D-DAE+: r is trained on the pBayes lookup table (Dirichlet s = 8C around the queries) instead.
Restorer: Linear(C,h1)–BN–LeakyReLU(0.2)–Linear(h1,h2)–BN–LeakyReLU(0.2)–Linear(h2,C)–BN–LeakyReLU(0.2)–softmax,
trained with the ℓ1 norm loss (mean-ℓ1 × C), SGD lr 1e-2, momentum 0.9, wd 1e-4, StepLR(epochs/2, 0.5).
Deviation: the official 200 epochs × batch 1024 assume 1,000,000 pairs; at small scale (a few thousand pairs) that
is a handful of SGD steps, so the defaults here are batch 64 for up to 100 epochs, capped at ``max_steps`` = 1500
SGD steps in total (same optimiser otherwise).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from modelward.core.seed import seeded
from modelward.extraction.attacks.base import (
    AttackError,
    AttackStrategy,
    Context,
    fit_substitute,
    seeded_model,
)
from modelward.extraction.attacks.pbayes import build_table


def restorer_hidden(c: int) -> tuple[int, int]:
    """Hidden sizes of the official restorer by class count (C=10 → 128/64, 43 → 512/256, 100 → 1024/512)."""
    if c <= 10:
        return 128, 64
    if c <= 43:
        return 512, 256
    if c <= 100:
        return 1024, 512
    return 2048, 1024


def make_restorer(c: int, hidden: tuple[int, int] | None = None) -> nn.Module:
    h1, h2 = hidden or restorer_hidden(c)
    return nn.Sequential(
        nn.Linear(c, h1), nn.BatchNorm1d(h1), nn.LeakyReLU(0.2),
        nn.Linear(h1, h2), nn.BatchNorm1d(h2), nn.LeakyReLU(0.2),
        nn.Linear(h2, c), nn.BatchNorm1d(c), nn.LeakyReLU(0.2),
        nn.Softmax(dim=1),
    )


def train_restorer(perturbed: torch.Tensor, clean: torch.Tensor, epochs: int, batch_size: int, seed: int,
                   hidden: tuple[int, int] | None = None, max_steps: int | None = None) -> nn.Module:
    c = clean.shape[1]
    if max_steps is not None:
        epochs = max(1, min(epochs, max_steps // max(1, -(-len(clean) // batch_size))))
    with seeded(seed):
        net = make_restorer(c, hidden)
    opt = torch.optim.SGD(net.parameters(), lr=1e-2, momentum=0.9, weight_decay=1e-4)
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=max(1, epochs // 2), gamma=0.5)
    g = torch.Generator().manual_seed(seed)
    n = len(clean)
    net.train()
    for _ in range(epochs):
        perm = torch.randperm(n, generator=g)
        for i in range(0, n, batch_size):
            idx = perm[i : i + batch_size]
            if len(idx) < 2:
                continue
            loss = (net(perturbed[idx]) - clean[idx]).abs().sum(1).mean()
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
        sched.step()
    net.eval()
    return net


class _Restorer(AttackStrategy):
    needs_knowledge = True

    def __init__(self, epochs: int = 100, batch_size: int = 64, hidden: tuple[int, int] | None = None,
                 max_steps: int = 1500) -> None:
        if epochs < 1 or batch_size < 2 or max_steps < 1:
            raise AttackError(f"{self.name}: epochs >= 1, batch_size >= 2 and max_steps >= 1 required")
        self.epochs, self.batch_size, self.hidden, self.max_steps = epochs, batch_size, hidden, max_steps
        self.restorer: nn.Module | None = None

    def pairs(self, ctx: Context, x: torch.Tensor, answers: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        raise NotImplementedError

    def recover(self, ctx: Context, x: torch.Tensor, answers: torch.Tensor) -> torch.Tensor:
        pert, clean = self.pairs(ctx, x, answers)
        self.restorer = train_restorer(pert, clean, self.epochs, self.batch_size, ctx.seed + 13, self.hidden,
                                       self.max_steps)
        with torch.no_grad():
            return self.restorer(answers.float())


class DDAE(_Restorer):
    """Restorer trained on the defense applied to S shadow models' predictions on the queries.

    Adaptive: needs the defense as ``knowledge`` (``knowledge_from_defense(defense)``).

    Args:
        shadows: shadow models S trained on the transfer set.
        shadow_epochs: training epochs of each shadow.
        shadow_fraction: fraction of the labelled pool each shadow trains on.
        epochs, batch_size, max_steps: the restorer's training schedule.
        hidden: the restorer's two hidden sizes (default by class count, as the official code).

    Returns:
        An attack strategy (how the substitute learns from the answers); combine it with a query strategy in
        :class:`ExtractionAttack` or by name with :func:`~modelward.extraction.attacks.make_extraction_attack`.

    Example:
        >>> from modelward.extraction.attacks import make_extraction_attack
        >>> attack = make_extraction_attack("knockoff", "ddae", strategy_params={"shadows": 2})
        >>> attack.strategy.needs_knowledge
        True
    """

    name = "ddae"

    def __init__(self, shadows: int = 5, shadow_epochs: int = 30, shadow_fraction: float = 0.5, epochs: int = 100,
                 batch_size: int = 64, hidden: tuple[int, int] | None = None, max_steps: int = 1500) -> None:
        super().__init__(epochs, batch_size, hidden, max_steps)
        if shadows < 1 or shadow_epochs < 1 or not 0 < shadow_fraction <= 1:
            raise AttackError("ddae: shadows >= 1, shadow_epochs >= 1 and 0 < shadow_fraction <= 1 required")
        self.shadows, self.shadow_epochs, self.shadow_fraction = shadows, shadow_epochs, shadow_fraction
        self._shadow_cache: tuple[Context, list[nn.Module]] | None = None

    def _train_shadows(self, ctx: Context) -> list[nn.Module]:
        if self._shadow_cache is not None and self._shadow_cache[0] is ctx:
            return self._shadow_cache[1]  # JBDA-TR re-recovers every round; the shadows do not depend on X_q
        if ctx.transfer.y is None:
            raise AttackError("ddae: the shadow models need a labelled pool (transfer set with labels)")
        g = torch.Generator().manual_seed(ctx.seed + 17)
        classes = torch.unique(ctx.transfer.y)
        c = ctx.num_classes
        # official shadows: 5 epochs from *pretrained* AlexNet; ours start from random weights, so they are trained
        # like the substitute (its optimiser settings) for shadow_epochs epochs to give confident predictions
        cfg = ctx.cfg.model_copy(update={"epochs": self.shadow_epochs})
        models = []
        for s in range(self.shadows):
            chosen = classes[torch.randperm(len(classes), generator=g)[: min(c, len(classes))]]
            mask = torch.isin(ctx.transfer.y, chosen)
            idx = mask.nonzero().flatten()
            idx = idx[torch.randperm(len(idx), generator=g)[: max(2, int(len(idx) * self.shadow_fraction))]]
            relabel = {int(k): i for i, k in enumerate(chosen.tolist())}
            y = torch.tensor([relabel[int(v)] for v in ctx.transfer.y[idx]])
            model = seeded_model(ctx.substitute_factory, ctx.seed + 100 + s)
            fit_substitute(model, ctx.transfer.x[idx], F.one_hot(y, c).float(), cfg, ctx.seed + 200 + s, None)
            models.append(model)
        self._shadow_cache = (ctx, models)
        return models

    def pairs(self, ctx: Context, x: torch.Tensor, answers: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        assert ctx.knowledge.perturb is not None
        clean, pert = [], []
        for m in self._train_shadows(ctx):
            with torch.no_grad():
                y = torch.softmax(m(x), 1)
            clean.append(y)
            pert.append(ctx.knowledge.perturb(y, x).float())
        return torch.cat(pert), torch.cat(clean)


class DDAEPlus(_Restorer):
    """D-DAE+: the restorer is trained on the pBayes lookup table (Dirichlet s = 8C, K per query).

    Adaptive: needs the defense as ``knowledge``.

    Args:
        k: Dirichlet samples per query in the lookup table.
        precision_factor: Dirichlet precision s = factor · C.
        epochs, batch_size, max_steps: the restorer's training schedule.
        hidden: the restorer's two hidden sizes (default by class count).

    Returns:
        An attack strategy (how the substitute learns from the answers); combine it with a query strategy in
        :class:`ExtractionAttack` or by name with :func:`~modelward.extraction.attacks.make_extraction_attack`.

    Example:
        >>> from modelward.extraction.attacks import make_extraction_attack
        >>> attack = make_extraction_attack("knockoff", "ddae_plus", strategy_params={"k": 5})
        >>> attack.strategy.k
        5
    """

    name = "ddae_plus"

    def __init__(self, k: int = 20, precision_factor: float = 8.0, epochs: int = 100, batch_size: int = 64,
                 hidden: tuple[int, int] | None = None, max_steps: int = 1500) -> None:
        super().__init__(epochs, batch_size, hidden, max_steps)
        self.k, self.precision_factor = k, precision_factor

    def pairs(self, ctx: Context, x: torch.Tensor, answers: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        means = ctx.knowledge.clean(x) if ctx.knowledge.clean is not None else answers
        table = build_table(ctx, x, means, self.k, self.precision_factor, ctx.seed + 11)
        return table.perturbed, table.clean
