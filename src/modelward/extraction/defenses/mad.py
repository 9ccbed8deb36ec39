"""MAD — Maximizing Angular Deviation (Orekondy et al., prediction poisoning; ModelGuard paper App. B.2).

    max_ŷ ‖ Gᵀŷ/‖Gᵀŷ‖₂ − Gᵀy/‖Gᵀy‖₂ ‖²₂   s.t. ‖ŷ − y‖₁ ≤ ε, argmax ŷ = argmax y, ŷ on the simplex,

with G the Jacobian of the per-class NLL of a randomly initialised surrogate (the official code: only w.r.t. the
last FC weight matrix), the argmax-preserving vertex oracle and the closed-form line search.

**Closed form of G.** For a last linear layer z = W a + b, ∂(−log softmax(z)_k)/∂W = (p − e_k) aᵀ with p the
surrogate's softmax. Hence Gᵀŷ = Σ_k ŷ_k (p − e_k) aᵀ = (p − ŷ) aᵀ for ŷ on the simplex, ‖Gᵀŷ‖ = ‖p − ŷ‖‖a‖, and
the objective is exactly ‖ (p − ŷ)/‖p − ŷ‖ − (p − y)/‖p − y‖ ‖²: the features a cancel. We therefore only need p
(one forward pass of the surrogate per query, no per-class backward passes); a test checks this against autograd.

Oracle (argmax variant, ``objmax``): candidates are uniform distributions over vertex sets S ∋ k* (k* = argmax y),
with k* up-weighted by 1e-5; for K ≤ 10 every such set is enumerated, for K > 10 S grows greedily (at most
``max_evals`` objective evaluations). Projection: α = clamp(ε / (‖y − y*‖₁ + 1e-7), 0, 1),
ŷ = (1 − α) y + α y* (top-1 kept because y and y* share the argmax).
"""

from __future__ import annotations

import itertools

import torch
from torch import Tensor, nn

from modelward.errors import ConfigError
from modelward.extraction.defenses.base import PredictionDefense

_UPWEIGHT = 1e-5
_EXHAUSTIVE_MAX_K = 10


def _angular_objective(p: Tensor, y: Tensor, cand: Tensor) -> Tensor:
    """‖u(p − ŷ) − u(p − y)‖² for candidates ``cand`` (B×M×K), u = normalisation; returns B×M."""
    def unit(v: Tensor) -> Tensor:
        return v / v.norm(dim=-1, keepdim=True).clamp_min(1e-12)

    ref = unit(p - y)[:, None, :]
    return (unit(p[:, None, :] - cand) - ref).pow(2).sum(-1)


class MAD(PredictionDefense):
    """MAD with ℓ1 budget ``epsilon`` and a random-init ``surrogate`` (an nn.Module returning logits).

    Maximizing angular deviation (Orekondy et al. 2020): each answer is the argmax-preserving vertex mix, within
    ℓ1 ε, that turns the surrogate's last-layer gradient furthest from the clean one.

    Args:
        epsilon: the ℓ1 budget ε, in [0, 2].
        surrogate: a randomly initialised model with the victim's architecture (returns logits); required.
        max_evals: objective evaluations of the greedy vertex search when K > 10.

    Returns:
        ``defense.defend(probs)`` (``probs``: a B × K batch of probability vectors) returns the perturbed vectors,
        B × K on the simplex; ``x=`` passes the queried inputs to defenses that need them. MAD needs ``x``.

    Example:
        >>> import torch
        >>> surrogate = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(4, 3))
        >>> x, y = torch.rand(2, 4), torch.tensor([[0.7, 0.2, 0.1], [0.4, 0.35, 0.25]])
        >>> out = MAD(epsilon=1.0, surrogate=surrogate).defend(y, x=x)
        >>> out.argmax(1).tolist()
        [0, 0]
    """

    name = "mad"
    needs = ("surrogate",)
    needs_inputs = True

    def __init__(self, epsilon: float = 1.0, surrogate: nn.Module | None = None, max_evals: int = 1024) -> None:
        if surrogate is None or not isinstance(surrogate, nn.Module):
            raise ConfigError("defense mad: needs surrogate=<nn.Module> (a randomly initialised model with the "
                              "victim's architecture), e.g. make_defense('mad', epsilon=1.0, surrogate=model)")
        if not 0.0 <= epsilon <= 2.0:
            raise ConfigError(f"defense mad: epsilon must be in [0, 2], got {epsilon!r}")
        self.epsilon = float(epsilon)
        self.surrogate = surrogate.eval()
        self.max_evals = int(max_evals)

    @torch.no_grad()
    def surrogate_probs(self, x: Tensor) -> Tensor:
        return torch.softmax(self.surrogate(x).to(torch.float64), dim=1)

    def _vertices(self, k: int, top: Tensor) -> Tensor:
        """All argmax-preserving vertex candidates for K ≤ 10: B × 2^(K−1) × K."""
        b = top.shape[0]
        masks = torch.tensor(list(itertools.product([0.0, 1.0], repeat=k - 1)), dtype=torch.float64)  # M×(K−1)
        cand = torch.zeros(b, masks.shape[0], k, dtype=torch.float64)
        others = torch.stack([torch.cat([torch.arange(t), torch.arange(t + 1, k)]) for t in top.tolist()])  # B×(K−1)
        cand.scatter_(2, others[:, None, :].expand(-1, masks.shape[0], -1), masks[None].expand(b, -1, -1).clone())
        cand[torch.arange(b), :, top] = 1.0 + _UPWEIGHT
        return cand / cand.sum(-1, keepdim=True)

    def _greedy(self, p: Tensor, y: Tensor, top: Tensor) -> Tensor:
        """Greedy growth of the vertex set for K > 10 (per row, capped at max_evals evaluations)."""
        b, k = y.shape
        member = torch.zeros(b, k, dtype=torch.bool)
        member[torch.arange(b), top] = True

        def dist(m: Tensor) -> Tensor:
            w = m.to(torch.float64)
            w[torch.arange(b), top] += _UPWEIGHT
            return w / w.sum(-1, keepdim=True)

        best = _angular_objective(p, y, dist(member)[:, None, :])[:, 0]
        evals, active = 1, torch.ones(b, dtype=torch.bool)
        while active.any() and evals + k <= self.max_evals:
            trial = member[:, None, :] | torch.eye(k, dtype=torch.bool)[None]  # add class j
            cand = torch.stack([dist(trial[:, j]) for j in range(k)], 1)
            obj = _angular_objective(p, y, cand)
            obj = torch.where(member, torch.full_like(obj, -torch.inf), obj)
            val, j = obj.max(1)
            evals += k
            improve = active & (val > best)
            member[improve, j[improve]] = True
            best = torch.where(improve, val, best)
            active = improve
        return dist(member)

    def _defend(self, y: Tensor, x: Tensor | None) -> Tensor:
        assert x is not None
        p = self.surrogate_probs(x)
        if p.shape != y.shape:
            raise ConfigError(f"defense mad: surrogate returns {p.shape[1]} classes, the victim {y.shape[1]}")
        top = y.argmax(1)
        b, k = y.shape
        if k <= _EXHAUSTIVE_MAX_K:
            cand = self._vertices(k, top)
            y_star = cand[torch.arange(b), _angular_objective(p, y, cand).argmax(1)]
        else:
            y_star = self._greedy(p, y, top)
        alpha = (self.epsilon / ((y - y_star).abs().sum(1) + 1e-7)).clamp(0.0, 1.0)[:, None]
        return (1.0 - alpha) * y + alpha * y_star

    def params(self) -> dict[str, float | int | str | bool | None]:
        return {"epsilon": self.epsilon, "max_evals": self.max_evals}
