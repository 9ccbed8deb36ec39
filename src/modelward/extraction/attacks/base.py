"""Model-extraction attacks = a query strategy × an attack strategy (seed 003 §4.1, App. B.1).

- A :class:`QueryStrategy` decides *which* inputs are sent (KnockoffNets random/adaptive, JBDA, JBDA-TR).
- An :class:`AttackStrategy` decides *how* each input is asked (plain, m repeats, n augmented copies), how the
  answers are *recovered* (identity, one-hot, restorer network, Bayes table) and how the substitute is *trained*
  (soft-label CE, plus a rotation head for S4L).
- :class:`ExtractionAttack` ties the two together behind one entry point, :meth:`ExtractionAttack.run`.

The victim is anything with ``query(x) -> probs`` and ``num_classes`` (a local model + defense, or a remote HTTP
endpoint). Adaptive attacks that "know the defense" (pBayes, D-DAE, D-DAE+) receive an :class:`AttackKnowledge`:
the attacker's offline replica ``perturb(y, x)`` of the defense mechanism (the official code's ``get_yprime``).

Substitute training follows the official code (digest §8): soft-label CE ``mean_i Σ_k −ỹ_k log softmax(f_s(x))_k``,
SGD momentum 0.5 without weight decay, LR halved every 10 epochs, 30 epochs; the extraction accuracy is the *best*
test accuracy over the epochs and the fidelity is taken at that epoch, against the victim's clean top-1.
"""

from __future__ import annotations

import time
from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

import torch
import torch.nn.functional as F
from pydantic import Field
from torch import nn

from modelward.core.config import StrictModel
from modelward.core.modules import eval_mode, model_device
from modelward.core.seed import seeded
from modelward.errors import ModelwardError


class AttackError(ModelwardError):
    """An attack cannot run with the given victim, transfer set or knowledge; the message says what is missing."""


@runtime_checkable
class VictimLike(Protocol):
    """What an attack needs from a victim: batched probability answers and the number of classes."""

    @property
    def num_classes(self) -> int: ...

    def query(self, x: torch.Tensor) -> torch.Tensor: ...


PerturbFn = Callable[[torch.Tensor, torch.Tensor | None], torch.Tensor]


@dataclass
class AttackKnowledge:
    """What an adaptive attacker knows about the defense (seed 003 §2: it "can reproduce the same perturbation").

    perturb: the defense mechanism applied offline to clean vectors (n, C), with the inputs (n, ...) for
        input-dependent defenses (MAD's Jacobian, AM's misinformation model); must not change defense state.
    preserves_top1: restrict Bayes-table matches to entries with the same top-1 (official ``Table_Recover``).
    max_distortion: drop table entries with ‖p(y) − y‖₁ above this (the code does it for ModelGuard-S, whose
        frozen quantizer falls back to the nearest centroid).
    clean: the victim's clean predictions; the paper's pBayes uses them as Dirichlet means (Remark 5, a simulation
        convenience). Without it pBayes centres its table on the answers instead.
    """

    perturb: PerturbFn | None = None
    preserves_top1: bool = True
    max_distortion: float | None = None
    clean: Callable[[torch.Tensor], torch.Tensor] | None = None


@dataclass(frozen=True)
class TransferSet:
    """The attacker's pool of natural (or synthetic) inputs; ``y`` (coarse/original labels) is optional.

    Args:
        x: the inputs.
        y: optional labels (KnockoffNets' adaptive policy acts on them; DDAE trains shadows on them).

    Example:
        >>> import torch
        >>> len(TransferSet(torch.rand(10, 4)))
        10
    """

    x: torch.Tensor
    y: torch.Tensor | None = None

    def __len__(self) -> int:
        return len(self.x)


@dataclass(frozen=True)
class EvalSet:
    """The victim's test set: true labels (extraction accuracy) and the victim's clean top-1 (fidelity).

    Args:
        x, y: test inputs and labels.
        victim_labels: the victim's clean top-1 on ``x``.

    Example:
        >>> import torch
        >>> EvalSet(torch.rand(3, 4), torch.tensor([0, 1, 2]), torch.tensor([0, 1, 1])).y.tolist()
        [0, 1, 2]
    """

    x: torch.Tensor
    y: torch.Tensor
    victim_labels: torch.Tensor


class SubstituteConfig(StrictModel):
    """Substitute training (digest §8: SGD momentum 0.5, no weight decay, LR × 0.5 every 10 epochs, 30 epochs).

    Args:
        epochs, batch_size, lr, momentum, weight_decay: the substitute's SGD schedule.
        lr_step, lr_gamma: multiply the learning rate by ``lr_gamma`` every ``lr_step`` epochs.
        query_batch_size: rows per victim query.

    Example:
        >>> SubstituteConfig(epochs=10).lr
        0.05
    """

    epochs: int = Field(30, ge=1)
    batch_size: int = Field(32, ge=1)
    lr: float = Field(0.05, gt=0.0)
    momentum: float = Field(0.5, ge=0.0, lt=1.0)
    weight_decay: float = Field(0.0, ge=0.0)
    lr_step: int = Field(10, ge=1)
    lr_gamma: float = Field(0.5, gt=0.0, le=1.0)
    query_batch_size: int = Field(128, ge=1)


@dataclass
class ExtractionResult:
    """Outcome of one attack: best-epoch extraction accuracy, fidelity at that epoch, and bookkeeping.

    Args:
        accuracy: the substitute's test accuracy at its best epoch.
        fidelity: agreement with the victim's clean top-1 at that epoch.
        best_epoch, curve: the best epoch and (epoch, accuracy, fidelity) per epoch.
        n_train, queries_used, seconds: training-set size, victim queries and wall time.
        recovery_distance: mean ‖ỹ − y‖₂ of the recovered answers (when clean answers are known).
        substitute: the trained substitute model.

    Returns:
        ``to_dict()`` gives the JSON-able fields.

    Example:
        >>> ExtractionResult(0.8, 0.85, 3, [(3, 0.8, 0.85)], 100, 100, 1.5).to_dict()["fidelity"]
        0.85
    """

    accuracy: float
    fidelity: float
    best_epoch: int
    curve: list[tuple[int, float, float]]
    n_train: int
    queries_used: int
    seconds: float
    recovery_distance: float | None = None  # mean ‖ỹ − y‖₂ when the clean predictions are known
    substitute: nn.Module | None = field(default=None, repr=False, compare=False)

    def to_dict(self) -> dict[str, Any]:
        return {
            "accuracy": self.accuracy, "fidelity": self.fidelity, "best_epoch": self.best_epoch,
            "curve": [list(c) for c in self.curve], "n_train": self.n_train, "queries_used": self.queries_used,
            "seconds": self.seconds, "recovery_distance": self.recovery_distance,
        }


# --------------------------------------------------------------------------------------------------------------
def seeded_model(factory: Callable[[], nn.Module], seed: int) -> nn.Module:
    """Build a fresh model whose initialisation depends only on `seed` (global RNG state is restored)."""
    with seeded(seed):
        return factory()


def query_in_batches(victim: VictimLike, x: torch.Tensor, batch_size: int) -> torch.Tensor:
    outs = [victim.query(x[i : i + batch_size]) for i in range(0, len(x), batch_size)]
    out = torch.cat(outs) if outs else torch.zeros(0, victim.num_classes)
    return out.detach().float().cpu()


@torch.no_grad()
def accuracy_and_fidelity(model: nn.Module, ev: EvalSet, batch_size: int = 1024) -> tuple[float, float]:
    dev = model_device(model)  # evaluated where the model is; predictions come back to the CPU
    with eval_mode(model):
        pred = torch.cat([model(ev.x[i : i + batch_size].to(dev)).argmax(1).cpu()
                          for i in range(0, len(ev.x), batch_size)])
    return (pred == ev.y).float().mean().item(), (pred == ev.victim_labels).float().mean().item()


def soft_cross_entropy(logits: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """mean_i Σ_k −ỹ_k log softmax(z)_k (the official ``soft_cross_entropy``)."""
    return -(target * F.log_softmax(logits, dim=1)).sum(1).mean()


def one_hot_top1(y: torch.Tensor) -> torch.Tensor:
    return F.one_hot(y.argmax(1), y.shape[1]).to(y.dtype)


@dataclass
class Context:
    """Everything a strategy may use while running one attack."""

    victim: VictimLike
    transfer: TransferSet
    knowledge: AttackKnowledge
    cfg: SubstituteConfig
    substitute_factory: Callable[[], nn.Module]
    seed: int
    num_classes: int
    generator: torch.Generator


class AttackStrategy:
    """How inputs are asked, how answers are recovered and how the substitute is trained (seed 003 §4.1)."""

    name: str = "strategy"
    needs_knowledge: bool = False

    def answer(self, ctx: Context, x: torch.Tensor) -> torch.Tensor:
        """The victim's answers for `x` as this strategy asks for them (default: one query per input)."""
        return query_in_batches(ctx.victim, x, ctx.cfg.query_batch_size)

    def recover(self, ctx: Context, x: torch.Tensor, answers: torch.Tensor) -> torch.Tensor:
        """Recovered labels Ỹ = r(Ŷ) (default: the identity, i.e. a non-adaptive attacker)."""
        return answers

    def train(self, ctx: Context, model: nn.Module, x: torch.Tensor, targets: torch.Tensor,
              ev: EvalSet | None, seed: int) -> list[tuple[int, float, float]]:
        """Soft-label CE training; returns [(epoch, test acc, fidelity)] after every epoch."""
        return fit_substitute(model, x, targets, ctx.cfg, seed, ev)

    def check(self, ctx: Context) -> None:
        if self.needs_knowledge and ctx.knowledge.perturb is None:
            raise AttackError(f"attack strategy {self.name!r} is adaptive: it needs the defense's offline "
                              "mechanism (AttackKnowledge.perturb); none was given for this victim")


def fit_substitute(model: nn.Module, x: torch.Tensor, targets: torch.Tensor, cfg: SubstituteConfig, seed: int,
                   ev: EvalSet | None, extra_loss: Callable[[nn.Module, torch.Tensor, torch.Generator],
                                                            torch.Tensor] | None = None,
                   extra_params: list[nn.Parameter] | None = None) -> list[tuple[int, float, float]]:
    """SGD(momentum) on soft targets with a step LR schedule; evaluates after every epoch."""
    g = torch.Generator().manual_seed(seed)
    params = list(model.parameters()) + list(extra_params or [])
    opt = torch.optim.SGD(params, lr=cfg.lr, momentum=cfg.momentum, weight_decay=cfg.weight_decay)
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=cfg.lr_step, gamma=cfg.lr_gamma)
    curve: list[tuple[int, float, float]] = []
    n = len(x)
    dev = model_device(model)  # batches go to the substitute's device
    for epoch in range(1, cfg.epochs + 1):
        model.train()
        perm = torch.randperm(n, generator=g)
        for i in range(0, n, cfg.batch_size):
            idx = perm[i : i + cfg.batch_size]
            if len(idx) < 2 and n > 1:
                continue  # a batch of one breaks BatchNorm; the sample is seen again next epoch
            xb = x[idx].to(dev, non_blocking=True)
            loss = soft_cross_entropy(model(xb), targets[idx].to(dev, non_blocking=True))
            if extra_loss is not None:
                loss = loss + extra_loss(model, xb, g)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
        sched.step()
        if ev is not None:
            acc, fid = accuracy_and_fidelity(model, ev)
            curve.append((epoch, acc, fid))
    model.eval()
    return curve


class QueryStrategy(ABC):
    """Chooses the query inputs within a budget of distinct inputs and collects the strategy's answers."""

    name: str = "query"

    @abstractmethod
    def collect(self, ctx: Context, strategy: AttackStrategy, budget: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Return (X_q, Ŷ_q): the inputs sent and the (raw, unrecovered) answers."""


@dataclass
class ExtractionAttack:
    """A query strategy × an attack strategy; ``run`` trains a substitute of the victim and scores it.

    Args:
        query: the query strategy (which inputs to send).
        strategy: the attack strategy (how to learn from the answers).
        cfg: substitute training.

    Returns:
        ``run(victim, transfer, budget, substitute_factory, seed=0, eval_set=None, knowledge=None)`` returns an
        :class:`ExtractionResult`.

    Example:
        >>> from modelward.extraction.attacks import make_extraction_attack
        >>> make_extraction_attack("knockoff", "pbayes").name
        'knockoff/pbayes'
    """

    query: QueryStrategy
    strategy: AttackStrategy
    cfg: SubstituteConfig = field(default_factory=SubstituteConfig)

    @property
    def name(self) -> str:
        return f"{self.query.name}/{self.strategy.name}"

    def run(self, victim: VictimLike, transfer: TransferSet, budget: int,
            substitute_factory: Callable[[], nn.Module], seed: int = 0, eval_set: EvalSet | None = None,
            knowledge: AttackKnowledge | None = None) -> ExtractionResult:
        """Query at most `budget` distinct inputs, recover, train the substitute, report the best epoch.

        `budget` counts distinct training inputs, as in the paper (50,000 images); strategies that ask each
        input several times (m-QPI, Smoothing) spend more victim queries, reported as ``queries_used``.
        """
        if budget < 1:
            raise AttackError(f"budget: must be >= 1, got {budget}")
        if len(transfer) == 0:
            raise AttackError("transfer set: empty")
        t0 = time.perf_counter()
        n_classes = int(victim.num_classes)
        ctx = Context(victim, transfer, knowledge or AttackKnowledge(), self.cfg, substitute_factory, seed,
                      n_classes, torch.Generator().manual_seed(seed))
        self.strategy.check(ctx)
        q0 = int(getattr(victim, "queries_used", 0))
        x, answers = self.query.collect(ctx, self.strategy, budget)
        targets = self.strategy.recover(ctx, x, answers)
        rec_dist = None
        if ctx.knowledge.clean is not None:
            clean = ctx.knowledge.clean(x)
            rec_dist = (targets - clean).norm(dim=1).mean().item()
        model = seeded_model(substitute_factory, seed)
        curve = self.strategy.train(ctx, model, x, targets, eval_set, seed + 1)
        if curve:
            best = max(curve, key=lambda c: (c[1], -c[0]))
        else:
            best = (self.cfg.epochs, float("nan"), float("nan"))
        q1 = int(getattr(victim, "queries_used", q0 + len(x)))
        return ExtractionResult(accuracy=best[1], fidelity=best[2], best_epoch=best[0], curve=curve,
                                n_train=len(x), queries_used=q1 - q0, seconds=time.perf_counter() - t0,
                                recovery_distance=rec_dist, substitute=model)


def knowledge_from_defense(defense: Any, clean: Callable[[torch.Tensor], torch.Tensor] | None = None
                           ) -> AttackKnowledge:
    """The adaptive attacker's knowledge of a :class:`~modelward.extraction.defenses.PredictionDefense`.

    Uses the defense's ``defend_frozen`` (the official ``get_yprime``: no state change; for ModelGuard-S the
    defender's current centroids, as the paper assumes), its top-1 guarantee, and — for stateful quantizers — its
    ℓ1 budget as the table's drop threshold.
    """
    needs_x = bool(getattr(defense, "needs_inputs", False))

    def perturb(y: torch.Tensor, x: torch.Tensor | None) -> torch.Tensor:
        return defense.defend_frozen(y, x if needs_x else None)

    eps = getattr(defense, "epsilon", None)
    return AttackKnowledge(perturb=perturb, preserves_top1=bool(getattr(defense, "preserves_top1", True)),
                           max_distortion=eps if getattr(defense, "stateful", False) else None, clean=clean)
