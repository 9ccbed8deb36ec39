"""Jacobian-based data augmentation query strategies (seed 003 §4.1; digest §6.1).

- :class:`JBDA` (Papernot et al. 2017): each round trains the substitute on the current set, then adds one copy of
  every sample moved by λ·sign(∇_x f_s(x)[ỹ]) along the substitute's Jacobian for the attacker's current label.
- :class:`JBDATR` (JBDA-TR, random-target variant from PRADA, official policy ``jbtr3``): k = 3 copies per sample
  per round, each made by T = 8 steps of targeted I-FGSM that *descends* CE toward a random target re-drawn every
  iteration, δ ← clip_[−ε, ε](δ − α·sign(∇_δ CE(f_s(x + δ), t))), α = 1.85 ε / T, x + δ clipped to the input range.

Both start from a seed set drawn from the transfer set with the attack's seed, re-initialise the substitute from
the same initial weights every round and retrain it on all answers so far, re-recovering every answer with the
attack strategy (the official JBDA-TR + pBayes rebuilds its table after every round). They stop at the budget.
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
)


class _JacobianAugmentation(QueryStrategy):
    def __init__(self, seed_size: int = 100, epsilon: float = 0.1, rounds: int | None = None,
                 clip: tuple[float, float] | None = (0.0, 1.0)) -> None:
        if seed_size < 1 or epsilon <= 0:
            raise AttackError(f"{self.name}: seed_size >= 1 and epsilon > 0 required")
        self.seed_size, self.epsilon, self.rounds, self.clip = seed_size, epsilon, rounds, clip
        self.sizes: list[int] = []  # |D| after each round

    def _augment(self, ctx: Context, model: torch.nn.Module, x: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError

    def _clip(self, x: torch.Tensor) -> torch.Tensor:
        return x.clamp(*self.clip) if self.clip is not None else x

    def collect(self, ctx: Context, strategy: AttackStrategy, budget: int) -> tuple[torch.Tensor, torch.Tensor]:
        n0 = min(self.seed_size, budget, len(ctx.transfer))
        idx = torch.randperm(len(ctx.transfer), generator=torch.Generator().manual_seed(ctx.seed))[:n0]
        x = ctx.transfer.x[idx]
        answers = strategy.answer(ctx, x)
        self.sizes = [len(x)]
        r = 0
        while len(x) < budget and (self.rounds is None or r < self.rounds):
            r += 1
            targets = strategy.recover(ctx, x, answers)
            model = seeded_model(ctx.substitute_factory, ctx.seed)  # same init every round (official code)
            strategy.train(ctx, model, x, targets, None, ctx.seed + r)
            new = self._augment(ctx, model, x, targets.argmax(1))[: budget - len(x)]
            if len(new) == 0:
                break
            x = torch.cat([x, new])
            answers = torch.cat([answers, strategy.answer(ctx, new)])
            self.sizes.append(len(x))
        return x, answers


class JBDA(_JacobianAugmentation):
    """Papernot's Jacobian-based augmentation: x' = x + λ·sign(∇_x f_s(x)_ỹ), one copy per sample per round.

    Args:
        seed_size: labelled seed queries drawn from the transfer set.
        epsilon: augmentation step λ.
        rounds: augmentation rounds (default: as many as the budget allows, doubling the set each round).
        clip: input box of the augmented points (None: unclipped).

    Returns:
        A query strategy; combine it with an attack strategy in :class:`ExtractionAttack` (or build both by name
        with :func:`~modelward.extraction.attacks.make_extraction_attack`), whose ``run(...)`` returns an
        :class:`ExtractionResult`.

    Example:
        >>> from modelward.extraction.attacks import make_extraction_attack
        >>> attack = make_extraction_attack("jbda", "top1", {"seed_size": 20})
        >>> attack.query.seed_size
        20
    """

    name = "jbda"

    def _augment(self, ctx: Context, model: torch.nn.Module, x: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        model.eval()
        xr = x.clone().requires_grad_(True)
        out = model(xr.to(model_device(model)))  # the gradient flows back to the CPU copy
        grad, = torch.autograd.grad(out.gather(1, labels[:, None].to(out.device)).sum(), xr)
        return self._clip(x + self.epsilon * grad.sign()).detach()


class JBDATR(_JacobianAugmentation):
    """JBDA-TR: k random-target I-FGSM copies per sample per round (official ``jbtr3``; ε = 0.1, T = 8).

    Args:
        seed_size: labelled seed queries drawn from the transfer set.
        epsilon: ℓ∞ budget of each I-FGSM copy.
        steps: I-FGSM steps T.
        copies: random-target copies per sample and round.
        rounds: augmentation rounds (default: as many as the budget allows).
        clip: input box of the augmented points (None: unclipped).

    Returns:
        A query strategy; combine it with an attack strategy in :class:`ExtractionAttack` (or build both by name
        with :func:`~modelward.extraction.attacks.make_extraction_attack`), whose ``run(...)`` returns an
        :class:`ExtractionResult`.

    Example:
        >>> from modelward.extraction.attacks import make_extraction_attack
        >>> attack = make_extraction_attack("jbda_tr", "naive", {"seed_size": 50, "copies": 2})
        >>> attack.query.copies
        2
    """

    name = "jbda_tr"

    def __init__(self, seed_size: int = 100, epsilon: float = 0.1, steps: int = 8, copies: int = 3,
                 rounds: int | None = None, clip: tuple[float, float] | None = (0.0, 1.0)) -> None:
        super().__init__(seed_size, epsilon, rounds, clip)
        if steps < 1 or copies < 1:
            raise AttackError("jbda_tr: steps >= 1 and copies >= 1 required")
        self.steps, self.copies = steps, copies
        self.alpha = 1.85 * epsilon / steps

    def _augment(self, ctx: Context, model: torch.nn.Module, x: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        model.eval()
        for p in model.parameters():
            p.requires_grad_(False)
        xs = x.repeat(self.copies, *([1] * (x.dim() - 1)))
        delta = torch.zeros_like(xs)
        for _ in range(self.steps):
            target = torch.randint(0, ctx.num_classes, (len(xs),), generator=ctx.generator)
            delta.requires_grad_(True)
            dev = model_device(model)  # the loss on the substitute's device; delta and its gradient on the CPU
            loss = F.cross_entropy(model(self._clip(xs + delta).to(dev)), target.to(dev))
            grad, = torch.autograd.grad(loss, delta)
            delta = (delta.detach() - self.alpha * grad.sign()).clamp(-self.epsilon, self.epsilon)
        for p in model.parameters():
            p.requires_grad_(True)
        return self._clip(xs + delta).detach()
