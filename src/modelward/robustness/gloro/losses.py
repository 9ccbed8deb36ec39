"""GloRo training losses (seed 002 §6.3.1, Definition 6.2).

- :func:`gloro_cross_entropy`: the label gets a 0 appended (⊥ is never correct) and softmax cross-entropy is taken
  over the m+1 GloRo logits, penalising x unless it is predicted correctly *and* certified.
- :func:`gloro_trades_loss`: ``CE(f(x), y) + λ · KL(softmax(f(x)) ⊕ 0 ‖ softmax(f̄^ε(x)))`` — the argument order of
  the reference implementation (the thesis writes D_KL(f̄ ‖ f) with mismatched sizes, errata 10). ``kind="ce"``
  replaces the KL by a cross-entropy. As in Keras' ``KLDivergence`` the probabilities are clipped to [1e-7, 1] and
  the target is not detached.
"""

from __future__ import annotations

from typing import Literal

import torch
import torch.nn.functional as F

TradesKind = Literal["kl", "ce"]
# log(1e-7) as float32 computes it, once (a Python float: no CPU tensor is created inside the training loop)
_LOG_EPS = float(torch.log(torch.tensor(1e-7)))


def gloro_cross_entropy(gloro_logits: torch.Tensor, y: torch.Tensor, temperature: float = 1.0) -> torch.Tensor:
    """Cross-entropy over the m+1 logits with targets in [m] (never ⊥)."""
    return F.cross_entropy(gloro_logits / temperature, y)


def gloro_trades_loss(logits: torch.Tensor, gloro_logits: torch.Tensor, y: torch.Tensor, lam: float,
                      kind: TradesKind = "kl") -> torch.Tensor:
    """GloRo-TRADES (Definition 6.2): standard CE on f plus λ times the robust term on f̄^ε."""
    standard = F.cross_entropy(logits, y)
    target = torch.cat([F.softmax(logits, 1), torch.zeros_like(logits[:, :1])], dim=1)
    log_pred = F.log_softmax(gloro_logits, 1).clamp_min(_LOG_EPS)
    if kind == "kl":
        t = target.clamp(1e-7, 1.0)
        robust = (t * (t.log() - log_pred)).sum(1).mean()
    elif kind == "ce":
        robust = -(target * log_pred).sum(1).mean()
    else:
        raise ValueError(f"kind {kind!r}: valid choices are 'kl', 'ce'")
    return standard + lam * robust
