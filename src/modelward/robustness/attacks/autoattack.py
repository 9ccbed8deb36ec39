"""AutoAttack, standard version (Croce & Hein, ICML 2020, §4): APGD-CE, APGD-T, FAB-T and Square in sequence.

Each attack runs only on the points every earlier one failed to break (points misclassified without attack count
as broken by ``"clean"``), so the result is the per-point worst case over the four — the robust accuracy RobustBench
reports. Standard settings: APGD-CE 100 iterations, 1 restart; APGD-T 100 iterations on each of the 9 highest other
classes; FAB-T 100 iterations on the same 9 targets; Square 5,000 queries, ``p_init = 0.8``.

Models with fewer than 4 classes (issue 38 item 4). The targeted DLR loss of APGD-T needs 4 classes and the
untargeted DLR loss 3; the reference code (``checks.check_n_classes`` of fra31/auto-attack) warns that the standard
version is then not possible and points to its other members. The few-class variant run here instead of failing:

- 3 classes: APGD-CE, **APGD-DLR** (untargeted DLR, a member of the reference's "plus" version), FAB-T on the 2
  other classes, Square;
- 2 classes: APGD-CE, **APGD-T on the targeted cross-entropy** (the reference code's ``ce-targeted`` loss, toward
  the one other class), FAB-T on the other class (untargeted FAB, in effect), Square.

``AutoAttackResult.members`` says which members ran.
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
#: the members for models with fewer than 4 classes (see the module docstring)
FEW_CLASSES: dict[int, tuple[str, ...]] = {3: ("apgd-ce", "apgd-dlr", "fab-t", "square"),
                                           2: ("apgd-ce", "apgd-t-ce", "fab-t", "square")}
#: every member name, in the order they run, and the fewest classes each needs
MEMBERS: dict[str, int] = {"apgd-ce": 2, "apgd-t": 4, "apgd-dlr": 3, "apgd-t-ce": 2, "fab-t": 2, "square": 2}


def members_for(num_classes: int, attacks: tuple[str, ...] | list[str] = STANDARD) -> tuple[str, ...]:
    """The members AutoAttack runs on a model with ``num_classes`` outputs: the standard four from 4 classes, the
    few-class variant below (when the standard version was asked for), else the given ones if the model has enough
    classes for each.

    Raises:
        ConfigError: a member the model has too few classes for (named, with the variant to use).
    """
    if num_classes < 2:
        raise ConfigError(f"autoattack: the model has {num_classes} output(s); a classifier needs at least 2")
    if tuple(attacks) == STANDARD and num_classes < 4:
        return FEW_CLASSES[num_classes]
    short = [a for a in attacks if MEMBERS[a] > num_classes]
    if short:
        raise ConfigError(f"autoattack: {', '.join(short)} need(s) at least {max(MEMBERS[a] for a in short)} classes, "
                          f"the model has {num_classes}; with the standard members the few-class variant "
                          f"{', '.join(FEW_CLASSES.get(num_classes, STANDARD))} runs instead")
    return tuple(attacks)


@dataclass(frozen=True)
class AutoAttackResult(AttackResult):
    """An :class:`AttackResult` plus which member broke each point (``"clean"`` if it was misclassified already,
    None if unbroken) and the seconds each member took."""

    broken_by: list[str | None] = field(default_factory=list)
    seconds: dict[str, float] = field(default_factory=dict)
    members: tuple[str, ...] = STANDARD

    def counts(self) -> dict[str, int]:
        """Points broken by each member that ran (and ``"clean"``), in order."""
        return {k: sum(1 for b in self.broken_by if b == k) for k in ("clean", *self.members)}


class AutoAttack(EvasionAttack):
    """AutoAttack, standard version (Croce & Hein 2020): the per-point worst case of APGD-CE, APGD-T, FAB-T, Square.

    Args:
        model: the classifier under attack (returns logits).
        eps: the budget ε.
        norm: ``"linf"`` or ``"l2"``.
        seed: seeds every member's random choices.
        steps: APGD / APGD-T / FAB-T iterations (standard: 100).
        ce_steps: APGD-CE's iterations when they differ from ``steps`` (a quick evaluation keeps APGD-CE at the
            reference's 100 and shortens the others: never weaker than one reference APGD-CE run).
        n_target_classes: APGD-T / FAB-T targets (standard: 9; capped at classes − 1).
        n_queries: Square's query budget (standard: 5,000).
        eot_iter: APGD-CE / APGD-T gradient draws per step (EOT, for a random forward pass; default 1).
        attacks: the members to run, in the order of :data:`MEMBERS` (default: the standard four; for a model with
            fewer than 4 classes the few-class variant, see the module docstring).
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
                 batch_size: int | None = None, eot_iter: int = 1, ce_steps: int | None = None) -> None:
        if norm not in ("linf", "l2"):
            raise ConfigError(f"{self.name}: norm must be 'linf' or 'l2', got {norm!r}")
        bad = [a for a in attacks if a not in MEMBERS]
        if bad or not attacks:
            raise ConfigError(f"{self.name}: attacks {bad or '[]'} unknown; choose among {', '.join(MEMBERS)}")
        super().__init__(model, eps, norm, clip, False, seed, batch_size)
        self.attacks = tuple(a for a in MEMBERS if a in attacks)
        kw = {"eps": eps, "norm": norm, "clip": clip, "seed": seed}
        self._builders = {
            "apgd-ce": lambda: APGD(model, steps=ce_steps or steps, loss="ce", eot_iter=eot_iter, **kw),
            "apgd-t": lambda: APGDT(model, steps=steps, n_target_classes=n_target_classes, eot_iter=eot_iter, **kw),
            "apgd-dlr": lambda: APGD(model, steps=steps, loss="dlr", eot_iter=eot_iter, **kw),
            "apgd-t-ce": lambda: APGDT(model, steps=steps, n_target_classes=n_target_classes, eot_iter=eot_iter,
                                       loss="ce", **kw),
            "fab-t": lambda: FAB(model, steps=steps, n_target_classes=n_target_classes, **kw),
            "square": lambda: Square(model, n_queries=n_queries, **kw),
        }
        self.members: dict[str, EvasionAttack] = {}

    def _members(self, num_classes: int) -> dict[str, EvasionAttack]:
        names = members_for(num_classes, self.attacks)
        if tuple(self.members) != names:
            self.members = {k: self._builders[k]() for k in names}
        return self.members

    def __call__(self, x: torch.Tensor, y: torch.Tensor, target: torch.Tensor | None = None) -> AutoAttackResult:
        import time

        if target is not None:
            raise ConfigError(f"{self.name}: untargeted only (APGD-T and FAB-T choose their targets)")
        self._seconds: dict[str, float] = {}
        self._broken_by: list[str | None] = []  # perturb appends one entry per point, batch after batch
        self._clock = time.perf_counter
        base = super().__call__(x, y)
        return AutoAttackResult(base.x_adv, base.success, list(self._broken_by), dict(self._seconds),
                                tuple(self.members))

    def perturb(self, x: torch.Tensor, y: torch.Tensor, target: torch.Tensor | None,
                gen: torch.Generator) -> torch.Tensor:
        out = x.clone()
        by: list[str | None] = [None] * len(x)
        with torch.no_grad():
            num_classes = int(self.model(x[:1]).shape[1])
        todo = predict(self.model, x) == y
        for i in (~todo).nonzero().squeeze(1).tolist():
            by[i] = "clean"
        for key, attack in self._members(num_classes).items():
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
