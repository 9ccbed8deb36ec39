"""Partial Bayes attack (seed 003 §3.4 Eq. 12–13, App. B.1 Eq. 21; official ``Table_Recover``, digest §4).

Lookup table T = ⋃_i {(y_j, p(y_j; x_i)) : y_j ~ Dir(mean = m_i, precision s = 8C), j = 1..K}, K = 20, where m_i is
the victim's clean prediction for query i (Remark 5's simulation convenience; without it, the answer ŷ_i).
Recovery of an answer ŷ: candidates = entries whose clean top-1 equals argmax ŷ (when the defense keeps top-1),
d_j = ‖p(y_j) − ŷ‖₁, tol = max(0.01, min_j d_j), ỹ = mean{ y_j : d_j ≤ tol }. Entries whose distortion exceeds the
defense's budget are dropped (the code does this for ModelGuard-S, whose frozen quantizer falls back to the
nearest centroid). The substitute is then trained on (X_q, Ỹ_q) with soft-label CE.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from modelward.extraction.attacks.base import AttackError, AttackStrategy, Context


@dataclass
class BayesTable:
    clean: torch.Tensor  # (M, C) sampled clean vectors y_j
    perturbed: torch.Tensor  # (M, C) p(y_j; x_i)


def dirichlet_samples(means: torch.Tensor, k: int, precision_factor: float, seed: int) -> torch.Tensor:
    """K Dirichlet(α = s·m, s = factor·C) samples per mean, seeded; returns (N·K, C) grouped by mean."""
    n, c = means.shape
    rng = np.random.default_rng(seed)
    alpha = np.clip(means.double().numpy() * precision_factor * c, 1e-6, None)
    g = rng.standard_gamma(np.repeat(alpha, k, axis=0))
    s = g.sum(1, keepdims=True)
    bad = s[:, 0] <= 0  # every component underflowed: fall back to the mean itself
    g[bad] = np.repeat(means.double().numpy(), k, axis=0)[bad]
    s[bad] = 1.0
    return torch.as_tensor(g / s, dtype=torch.float32)


def build_table(ctx: Context, x: torch.Tensor, means: torch.Tensor, k: int, precision_factor: float,
                seed: int, chunk: int = 4096) -> BayesTable:
    perturb = ctx.knowledge.perturb
    if perturb is None:
        raise AttackError("pbayes: needs the defense's offline mechanism (AttackKnowledge.perturb)")
    clean = dirichlet_samples(means, k, precision_factor, seed)
    xs_idx = torch.arange(len(x)).repeat_interleave(k)
    out = []
    for i in range(0, len(clean), chunk):
        out.append(perturb(clean[i : i + chunk], x[xs_idx[i : i + chunk]]).float())
    pert = torch.cat(out) if out else clean.clone()
    keep = torch.isfinite(pert).all(1)
    if ctx.knowledge.max_distortion is not None:
        keep &= (pert - clean).abs().sum(1) <= ctx.knowledge.max_distortion + 1e-6
    if not bool(keep.any()):
        raise AttackError("pbayes: every table entry was dropped (distortion above the defense's budget)")
    return BayesTable(clean[keep], pert[keep])


def table_recover(table: BayesTable, answers: torch.Tensor, same_top1: bool, min_tol: float = 0.01,
                  chunk: int = 256) -> torch.Tensor:
    """ỹ = mean of the clean entries within ℓ1 max(min_tol, nearest distance) of each answer."""
    out = torch.empty_like(answers)
    top_t = table.clean.argmax(1)
    for i in range(0, len(answers), chunk):
        a = answers[i : i + chunk]
        d = torch.cdist(a.double(), table.perturbed.double(), p=1)
        if same_top1:
            mask = top_t[None, :] == a.argmax(1)[:, None]
            has = mask.any(1, keepdim=True)
            d = torch.where(mask | ~has, d, torch.full_like(d, float("inf")))  # no candidate: search all
        tol = d.min(1, keepdim=True).values.clamp_min(min_tol)
        w = (d <= tol).double()
        out[i : i + chunk] = ((w @ table.clean.double()) / w.sum(1, keepdim=True)).float()
    return out


class PBayes(AttackStrategy):
    """Bayes-estimator recovery E[Y | Ŷ] approximated by a Dirichlet neighbourhood lookup table.

    Adaptive: needs the defense as ``knowledge`` (it perturbs the table's clean samples like the victim does).

    Args:
        k: Dirichlet samples per query.
        precision_factor: Dirichlet precision s = factor · C.
        tolerance: smallest ℓ1 neighbourhood of an answer in the table.

    Returns:
        An attack strategy (how the substitute learns from the answers); combine it with a query strategy in
        :class:`ExtractionAttack` or by name with :func:`~modelward.extraction.attacks.make_extraction_attack`.

    Example:
        >>> from modelward.extraction.attacks import make_extraction_attack
        >>> attack = make_extraction_attack("knockoff", "pbayes", strategy_params={"k": 10})
        >>> attack.strategy.k
        10
    """

    name = "pbayes"
    needs_knowledge = True

    def __init__(self, k: int = 20, precision_factor: float = 8.0, tolerance: float = 0.01) -> None:
        if k < 1 or precision_factor <= 0 or tolerance < 0:
            raise AttackError("pbayes: k >= 1, precision_factor > 0 and tolerance >= 0 required")
        self.k, self.precision_factor, self.tolerance = k, precision_factor, tolerance
        self.table: BayesTable | None = None

    def recover(self, ctx: Context, x: torch.Tensor, answers: torch.Tensor) -> torch.Tensor:
        means = ctx.knowledge.clean(x) if ctx.knowledge.clean is not None else answers
        self.table = build_table(ctx, x, means, self.k, self.precision_factor, ctx.seed + 11)
        return table_recover(self.table, answers, ctx.knowledge.preserves_top1, self.tolerance)
