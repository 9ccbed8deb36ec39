"""Robustness of a text classifier: token substitutions (HotFlip) and perturbations of the token embeddings.

Two threat models, reported separately because they mean different things:

- **token substitution** (:class:`~modelward.robustness.attacks.hotflip.HotFlip`): an attacker edits the text,
  replacing up to a fraction of its tokens by any vocabulary tokens. Robust accuracy here is a statement about
  texts someone could send (with no constraint that the meaning is kept: an upper bound on the attacker's power
  compared with synonym attacks).
- **embedding space** (PGD and FGSM on :class:`~modelward.core.text.EmbeddingSpace`): the token embeddings of
  every real token are perturbed inside an L∞ or ℓ2 ball (Miyato et al. 2017; the inner step of FreeLB-style
  adversarial training). No text maps to most such points: the number measures how smooth the model is around
  its inputs, not what an attacker sending text can do. Radii are in units of σ, the standard deviation of the
  embedding table's entries (L∞ ε·σ per coordinate; ℓ2 ε·σ·√D, the norm of moving one token's D coordinates by
  ε·σ each), so they compare across models.

The same PGD and FGSM code as for images runs on the embedding perturbation (clean point δ = 0, unbounded box);
the attention mask still comes from the token ids, so padding positions never change the logits.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch
from torch import nn

from modelward.core.text import EmbeddingSpace, embedding_scale, token_embedding
from modelward.robustness.attacks import make_attack
from modelward.robustness.attacks.hotflip import HotFlip

#: progress callback ``(done_units, message)``
Report = Callable[[int, str], None]
_UNBOUNDED = (-float("inf"), float("inf"))


@dataclass(frozen=True)
class TextCurve:
    """Robust accuracy of one attack over its budgets.

    Attributes:
        attack: e.g. "HotFlip", "PGD L∞ (embeddings)"; budgets: fractions of tokens (HotFlip) or ε in σ units;
        accuracy: robust accuracy per budget on all ``n`` points; n: points; mean_flips: HotFlip's substitutions per
        broken point (None for embedding attacks).
    """

    attack: str
    budgets: tuple[float, ...]
    accuracy: tuple[float, ...]
    n: int
    mean_flips: tuple[float | None, ...] = ()


def token_substitution_curve(model: nn.Module, ids: torch.Tensor, y: torch.Tensor, fractions: Sequence[float],
                             special_ids: Sequence[int], candidates: int = 32,
                             report: Report | None = None) -> TextCurve:
    """Robust accuracy under HotFlip with a budget of each fraction of a text's real tokens (at least one).

    Example:
        >>> emb = nn.Embedding(20, 4); net = nn.Sequential(emb, nn.Flatten(), nn.Linear(24, 2))
        >>> c = token_substitution_curve(net, torch.randint(4, 20, (8, 6)), torch.zeros(8, dtype=torch.long),
        ...                              [0.2], special_ids=(0, 1, 2, 3))
        >>> c.attack, len(c.accuracy)
        ('HotFlip', 1)
    """
    acc, flips = [], []
    for f in fractions:
        atk = HotFlip(model, budget=float(f), special_ids=tuple(special_ids), candidates=candidates)
        res = atk(ids, y)
        acc.append(float((~res.success).float().mean()))
        broken = res.success & (atk.flips > 0)
        flips.append(float(atk.flips[broken].float().mean()) if broken.any() else None)
        if report is not None:
            report(len(ids), f"HotFlip ≤ {100 * f:.0f} % of tokens: {len(ids)} points, robust {100 * acc[-1]:.1f} %")
    return TextCurve("HotFlip", tuple(float(f) for f in fractions), tuple(acc), len(ids), tuple(flips))


def embedding_curves(model: nn.Module, ids: torch.Tensor, y: torch.Tensor, linf: Sequence[float],
                     l2: Sequence[float], steps: int, special_ids: Sequence[int], seed: int = 0,
                     batch_size: int = 128, report: Report | None = None) -> tuple[list[TextCurve], float]:
    """FGSM and PGD robust accuracy in the embedding space, L∞ radii ``linf`` and ℓ2 radii ``l2`` in σ units.

    Returns:
        ``(curves, σ)``: one :class:`TextCurve` per attack and norm, and the σ the radii are measured in.
    """
    sigma = embedding_scale(model, special_ids)
    dim = token_embedding(model).embedding_dim
    curves = []
    for norm, radii, unit in (("linf", linf, sigma), ("l2", l2, sigma * dim**0.5)):
        for name in ("fgsm", "pgd"):
            acc = []
            for eps in radii:
                still = 0
                for i in range(0, len(ids), batch_size):
                    space = EmbeddingSpace(model, ids[i : i + batch_size])
                    params = {"norm": norm, "clip": _UNBOUNDED}
                    if name == "pgd":
                        params.update(steps=steps, seed=seed)
                    res = make_attack(name, space, eps=float(eps) * unit, **params)(
                        space.zeros(), y[i : i + batch_size])
                    still += int((~res.success).sum())
                acc.append(still / len(ids))
                if report is not None:
                    report(len(ids), f"{name.upper()} {'L∞' if norm == 'linf' else 'ℓ2'} (embeddings) ε = {eps:g} σ: "
                           f"{len(ids)} points, robust {100 * acc[-1]:.1f} %")
            label = f"{name.upper()} {'L∞' if norm == 'linf' else 'ℓ2'} (embeddings)"
            curves.append(TextCurve(label, tuple(float(e) for e in radii), tuple(acc), len(ids)))
    return curves, sigma
