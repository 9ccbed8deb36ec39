"""AutoAttack, standard version (Croce & Hein, ICML 2020, §4): APGD-CE, APGD-T, FAB-T and Square in sequence.

Each attack runs only on the points every earlier one failed to break (points misclassified without attack count
as broken by ``"clean"``), so the result is the per-point worst case over the four — the robust accuracy RobustBench
reports. Standard settings: APGD-CE 100 iterations, 1 restart; APGD-T 100 iterations on each of the 9 highest other
classes; FAB-T 100 iterations on the same 9 targets; Square 5,000 queries, ``p_init = 0.8``.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from torch import nn

from modelward.errors import ConfigError
from modelward.robustness.attacks.apgd import APGD
from modelward.robustness.attacks.apgdt import APGDT
from modelward.robustness.attacks.base import AttackResult, EvasionAttack, Norm, predict
from modelward.robustness.attacks.fab import FAB
from modelward.robustness.attacks.square import Square

#: the standard version's members, in order
STANDARD = ("apgd-ce", "apgd-t", "fab-t", "square")


@dataclass(frozen=True)
class AutoAttackResult(AttackResult):
    """An :class:`AttackResult` plus which member broke each point (``"clean"`` if it was misclassified already,
    None if unbroken) and the seconds each member took."""

    broken_by: list[str | None] = field(default_factory=list)
    seconds: dict[str, float] = field(default_factory=dict)

    def counts(self) -> dict[str, int]:
        """Points broken by each member (and ``"clean"``), in order."""
        return {k: sum(1 for b in self.broken_by if b == k) for k in ("clean", *STANDARD)}


class AutoAttack(EvasionAttack):
    """AutoAttack, standard version (Croce & Hein 2020): the per-point worst case of APGD-CE, APGD-T, FAB-T, Square.

    Args:
        model: the classifier under attack (returns logits).
        eps: the budget ε.
        norm: ``"linf"`` or ``"l2"``.
        seed: seeds every member's random choices.
        steps: APGD / APGD-T / FAB-T iterations (standard: 100).
        n_target_classes: APGD-T / FAB-T targets (standard: 9; capped at classes − 1).
        n_queries: Square's query budget (standard: 5,000).
        eot_iter: APGD-CE / APGD-T gradient draws per step (EOT, for a random forward pass; default 1).
        attacks: the members to run, a subset of ``("apgd-ce", "apgd-t", "fab-t", "square")`` in that order.
        clip: the input box.
        batch_size: attack this many points at a time (default: all).

    Returns:
        ``attack(x, y)`` returns an :class:`AutoAttackResult` (``x_adv``, ``success``, ``broken_by``, ``seconds``);
        ``1 − success.mean()`` is the robust accuracy. Unbroken points carry APGD-CE's highest-loss iterate.

    Example:
        >>> import torch
        >>> from torch import nn
        >>> model = nn.Sequential(nn.Flatten(), nn.Linear(64, 10))
        >>> x, y = torch.rand(8, 1, 8, 8), torch.randint(10, (8,))
        >>> res = AutoAttack(model, eps=0.05, norm="linf", steps=5, n_queries=20)(x, y)
        >>> len(res.broken_by) == 8 and bool(((res.x_adv - x).abs() <= 0.05 + 1e-6).all())
        True
    """

    name = "autoattack"
    supports_targeted = False
    norms = ("linf", "l2")

    def __init__(self, model: nn.Module, eps: float = 8 / 255, norm: Norm = "linf", seed: int = 0,
                 steps: int = 100, n_target_classes: int = 9, n_queries: int = 5000,
                 attacks: tuple[str, ...] | list[str] = STANDARD, clip: tuple[float, float] = (0.0, 1.0),
                 batch_size: int | None = None, eot_iter: int = 1) -> None:
        if norm not in ("linf", "l2"):
            raise ConfigError(f"{self.name}: norm must be 'linf' or 'l2', got {norm!r}")
        bad = [a for a in attacks if a not in STANDARD]
        if bad or not attacks:
            raise ConfigError(f"{self.name}: attacks {bad or '[]'} unknown; choose among {', '.join(STANDARD)}")
        super().__init__(model, eps, norm, clip, False, seed, batch_size)
        kw = {"eps": eps, "norm": norm, "clip": clip, "seed": seed}
        members: dict[str, EvasionAttack] = {
            "apgd-ce": APGD(model, steps=steps, loss="ce", eot_iter=eot_iter, **kw),
            "apgd-t": APGDT(model, steps=steps, n_target_classes=n_target_classes, eot_iter=eot_iter, **kw),
            "fab-t": FAB(model, steps=steps, n_target_classes=n_target_classes, **kw),
            "square": Square(model, n_queries=n_queries, **kw),
        }
        self.members = {k: v for k, v in members.items() if k in attacks}

    def __call__(self, x: torch.Tensor, y: torch.Tensor, target: torch.Tensor | None = None) -> AutoAttackResult:
        import time

        if target is not None:
            raise ConfigError(f"{self.name}: untargeted only (APGD-T and FAB-T choose their targets)")
        self._seconds: dict[str, float] = {}
        self._broken_by: list[str | None] = []  # perturb appends one entry per point, batch after batch
        self._clock = time.perf_counter
        base = super().__call__(x, y)
        return AutoAttackResult(base.x_adv, base.success, list(self._broken_by), dict(self._seconds))

    def perturb(self, x: torch.Tensor, y: torch.Tensor, target: torch.Tensor | None,
                gen: torch.Generator) -> torch.Tensor:
        out = x.clone()
        by: list[str | None] = [None] * len(x)
        todo = predict(self.model, x) == y
        for i in (~todo).nonzero().squeeze(1).tolist():
            by[i] = "clean"
        for key, attack in self.members.items():
            rows = todo.nonzero().squeeze(1)
            if len(rows) == 0:
                break
            t0 = self._clock()
            adv = attack.enforce(attack.perturb(x[rows], y[rows], None, gen).detach(), x[rows])
            broken = predict(self.model, adv) != y[rows]
            if key == "apgd-ce":  # unbroken points keep APGD-CE's highest-loss point (the loss diagnostics read it)
                out[rows] = adv
            else:
                out[rows[broken]] = adv[broken]
            todo[rows[broken]] = False
            for i in rows[broken].tolist():
                by[i] = key
            self._seconds[key] = self._seconds.get(key, 0.0) + self._clock() - t0
        self._broken_by.extend(by)
        return out
