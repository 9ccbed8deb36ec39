"""GloRo nets (seed 002 ch. 6, App. A.1) and their relaxations RTK / affinity (ch. 7, Algorithms 7.1–7.2).

A :class:`GloroNet` wraps an ``nn.Sequential`` logit model ``f`` whose last layer is ``nn.Linear`` and appends the
⊥ logit. Margin form (App. A.1, used in all experiments)::

    K*_ij = L_sub · ‖W_j − W_i‖₂        (L_sub = Lipschitz bound of every layer before the last, Eq. 6.9)
    f̄_⊥(x) = max_{i ≠ j} { f_i(x) + ε K*_ij },   j = F(x) the *predicted* class

If ``argmax f̄ ≠ ⊥`` then F is ε-locally-robust at x (Theorem A.1). In training mode the bound is recomputed every
step from the persistent power iterates (``num_iterations`` per step); :meth:`GloroNet.freeze` computes the
certified float64 bound once and inference reuses it, so certification costs one forward pass.

A certificate never rests on a stale or low bound: the frozen bound is keyed on the model's *contents* — a copy of
every parameter and buffer and the identity of every layer taken at :meth:`~GloroNet.freeze` — so edits through
``.data`` (which bump no version counter) and swapped layers invalidate it, and a swapped layer also rebuilds the
per-layer bounds. An eval-mode forward without a valid frozen bound freezes first (a sound upper bound), instead of
using the power iterates, which estimate the norms from below.

RTK / affinity ⊥ logit: ``g_⊥ = max_i f_i − m(x)`` with the gradient flowing through both terms
(``bottom_gradient="full"``, the reference gloro library's later code); the thesis' footnote variant
``stop_gradient(max_i f_i) − m(x)`` (``bottom_gradient="stop"``) is kept for comparison but does not train:
with the top logit frozen, lowering every logit is free and the loss saturates (VRA 0 on digits, docs/robustness.md).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

import torch
from torch import nn

from modelward.robustness.gloro.lipschitz import GloroError, LayerNorm, LipschitzBound

Variant = Literal["margin", "basic"]
BottomGradient = Literal["full", "stop"]


@dataclass(frozen=True)
class FreezeReport:
    """The certified bound: L_sub, the largest pairwise margin constant and how each layer was bounded."""

    lipschitz_sub: float
    max_margin_lipschitz: float
    layers: tuple[LayerNorm, ...]

    def to_dict(self) -> dict:
        return {"lipschitz_sub": self.lipschitz_sub, "max_margin_lipschitz": self.max_margin_lipschitz,
                "layers": [vars(r) for r in self.layers]}


def _round_up_float32(t: torch.Tensor) -> torch.Tensor:
    """Float64 → float32 rounding *up*, so the stored bound is never below the float64 one."""
    t32 = t.float()
    low = t32.double() < t
    return torch.where(low, torch.nextafter(t32, torch.full_like(t32, float("inf"))), t32)


class GloroNet(nn.Module):
    """``f̄^ε``: the model's m logits plus the ⊥ logit (Eq. 6.3; margin variant App. A.1 or basic Eq. 6.2).

    Args:
        model: an ``nn.Sequential`` ending in ``nn.Linear`` (see :func:`build_gloro_model`).
        input_shape: one input's shape (no batch dimension), for the power iterations.
        epsilon: the ℓ2 radius ε the ⊥ logit certifies (training ε; certification may use another).
        num_iterations: power iterations per training step.
        variant: ``"margin"`` (pairwise margin bound, App. A.1) or ``"basic"`` (Eq. 6.2).
        seed: seeds the power-iteration start vectors.

    Returns:
        A module whose forward gives (B, m+1) logits, the last one ⊥; ``freeze()`` computes the certified bound,
        :func:`certify` / :func:`certified_radius` use it.

    Example:
        >>> import torch
        >>> from modelward.robustness.gloro import build_gloro_model
        >>> net = GloroNet(build_gloro_model("d(16)", (4,), 3, seed=0), (4,), epsilon=0.1)
        >>> net(torch.rand(2, 4)).shape
        torch.Size([2, 4])
    """

    def __init__(self, model: nn.Module, input_shape: Sequence[int], epsilon: float, num_iterations: int = 5,
                 variant: Variant = "margin", seed: int = 0) -> None:
        super().__init__()
        if not isinstance(model, nn.Sequential):
            raise GloroError(f"GloRo needs an nn.Sequential whose last layer is nn.Linear, got {type(model).__name__}"
                             " (build one with modelward.robustness.gloro.build_gloro_model)")
        children = list(model.named_children())
        if not children or not isinstance(children[-1][1], nn.Linear):
            last = type(children[-1][1]).__name__ if children else "nothing"
            raise GloroError(f"GloRo needs the last layer to be nn.Linear (the margin bound uses its rows), got {last}")
        if epsilon < 0:
            raise GloroError(f"epsilon must be >= 0, got {epsilon}")
        if variant not in ("margin", "basic"):
            raise GloroError(f"variant {variant!r}: valid choices are 'margin', 'basic'")
        self.f = model
        self.input_shape = tuple(input_shape)
        self._seed = seed
        self.sub = LipschitzBound(children[:-1], self.input_shape, seed)
        self.epsilon = float(epsilon)
        self.num_iterations = int(num_iterations)
        self.variant = variant
        self.register_buffer("frozen_K", torch.zeros(0), persistent=False)
        self._frozen_snapshot: list[torch.Tensor] = []
        self._frozen_structure: tuple = ()
        self._sub_structure = self._structure()

    @property
    def last(self) -> nn.Linear:
        return self.f[-1]

    @property
    def num_classes(self) -> int:
        return self.last.out_features

    # -- Lipschitz constants --------------------------------------------------------------------------------
    def _pairwise(self, lsub: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        m = w.shape[0]
        eye = torch.eye(m, dtype=w.dtype, device=w.device)
        if self.variant == "basic":
            k = lsub * w.norm(dim=1)
            return (k[:, None] + k[None, :]) * (1 - eye)
        sq = (w[:, None, :] - w[None, :, :]).pow(2).sum(-1)
        # +eye keeps sqrt differentiable on the (masked) diagonal
        return lsub * torch.sqrt(sq + eye) * (1 - eye)

    def _structure(self) -> tuple:
        """Which module objects make up the model (a swapped layer changes it), with their tensors' shapes."""
        return tuple((name, id(m), type(m)) for name, m in self.f.named_modules()) + tuple(
            (name, id(t), tuple(t.shape)) for name, t in self._tensors())

    def _tensors(self) -> list[tuple[str, torch.Tensor]]:
        return list(self.f.named_parameters()) + list(self.f.named_buffers())

    def _sync_bound(self) -> None:
        """Rebuild the per-layer bounds if a layer was swapped since they were built (they hold the old layers)."""
        structure = self._structure()
        if structure == self._sub_structure:
            return
        children = list(self.f.named_children())
        if not children or not isinstance(children[-1][1], nn.Linear):
            raise GloroError("GloRo needs the last layer to be nn.Linear (the margin bound uses its rows)")
        ref = next(iter(self.f.parameters()), None)
        sub = LipschitzBound(children[:-1], self.input_shape, self._seed)
        self.sub = sub.to(ref.device) if ref is not None else sub
        self._sub_structure = structure

    def margin_lipschitz(self, n_iter: int = 0) -> torch.Tensor:
        """(m, m) matrix K*_ij from the stored iterates (after ``n_iter`` more power iterations); differentiable."""
        self._sync_bound()
        return self._pairwise(self.sub(n_iter), self.last.weight)

    @property
    def frozen(self) -> bool:
        """True while a frozen bound exists and the model is the one it was computed for: same layers, and every
        parameter/buffer equal to its value at :meth:`freeze` (a content check, so ``.data`` edits count)."""
        if self.frozen_K.numel() == 0 or self._frozen_structure != self._structure():
            return False
        return all(t.device == snap.device and torch.equal(t.detach(), snap)
                   for (_, t), snap in zip(self._tensors(), self._frozen_snapshot, strict=True))

    def freeze(self, tol: float = 1e-9, max_iter: int = 5000, exact_limit: int = 4_000_000) -> FreezeReport:
        """Certified float64 bound (exact SVD where affordable, else a proven upper bound) fixed for inference."""
        self._sync_bound()
        lsub, layers = self.sub.certified(tol, max_iter, exact_limit)
        with torch.no_grad():
            w64 = self.last.weight.detach().double()
            k64 = self._pairwise(torch.tensor(lsub, dtype=torch.float64, device=w64.device), w64)
            self.frozen_K = _round_up_float32(k64).to(self.last.weight.device)
        self._frozen_snapshot = [t.detach().clone() for _, t in self._tensors()]
        self._frozen_structure = self._structure()
        return FreezeReport(lsub, float(k64.max()), tuple(layers))

    def unfreeze(self) -> None:
        self.frozen_K = torch.zeros(0, device=self.frozen_K.device)
        self._frozen_snapshot, self._frozen_structure = [], ()

    def lipschitz_constant(self) -> torch.Tensor:
        """The certified K* (frozen; freezes first if the frozen bound is missing or stale)."""
        if not self.frozen:
            self.freeze()
        return self.frozen_K

    def _current_K(self) -> torch.Tensor:
        if self.training:
            return self.margin_lipschitz(self.num_iterations)
        # evaluation: only a certified bound (the power iterates are lower estimates of the norms)
        if not self.frozen:
            self.freeze()
        return self.frozen_K

    # -- outputs ----------------------------------------------------------------------------------------------
    def bottom(self, logits: torch.Tensor, K: torch.Tensor) -> torch.Tensor:
        """f̄_⊥ = max_{i≠j} (f_i + ε K*_ji) with j the predicted class."""
        j = logits.argmax(1)
        cand = logits + self.epsilon * K[j]
        cand = cand.masked_fill(nn.functional.one_hot(j, logits.shape[1]).bool(), float("-inf"))
        return cand.max(1).values

    def top_k_margins(self, logits: torch.Tensor, K: torch.Tensor) -> torch.Tensor:
        """(B, k_max) certified margins m^k (Eq. 7.1); > 0 certifies the top-k set. Standard GloRo: k_max = 1."""
        return (logits.max(1).values - self.bottom(logits, K))[:, None]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """(B, m+1) logits: the model's m logits then ⊥."""
        logits = self.f(x)
        K = self._current_K()
        return torch.cat([logits, self.bottom(logits, K)[:, None]], dim=1)

    def clean(self, x: torch.Tensor) -> torch.Tensor:
        """The underlying model's logits (no certification)."""
        return self.f(x)


def _margins_by_k(logits: torch.Tensor, K: torch.Tensor, eps: float, k_max: int) -> torch.Tensor:
    """m^k(x) for k = 1..k_max (Algorithm 7.1): min_{j∈F^k} f_j − max_{i∉F^k} (f_i + ε K_ji)."""
    b, m = logits.shape
    rank = logits.argsort(1, descending=True).argsort(1)  # rank[b, i] = position of class i
    A = logits[:, None, :] + eps * K[None, :, :]  # A[b, j, i] = f_i + ε K_ji
    out = []
    for k in range(1, k_max + 1):
        in_top = rank < k
        worst_out = A.masked_fill(in_top[:, None, :], float("-inf")).max(2).values  # over i ∉ F^k, per j
        mj = logits - worst_out
        out.append(mj.masked_fill(~in_top, float("inf")).min(1).values)
    return torch.stack(out, dim=1)


def _check_bottom_gradient(value: str) -> str:
    if value not in ("full", "stop"):
        raise GloroError(f"bottom_gradient {value!r}: valid choices are 'full' (reference library, trains) and "
                         "'stop' (thesis footnote, does not train)")
    return value


def _relaxed_bottom(logits: torch.Tensor, margins: torch.Tensor, gradient: str) -> torch.Tensor:
    """g_⊥ = max_i f_i − max_k m^k (Eq. 7.1 / 7.3); ``gradient="stop"`` detaches max f (thesis footnote)."""
    top = logits.max(1).values
    return (top.detach() if gradient == "stop" else top) - margins.max(1).values


class RtkGloroNet(GloroNet):
    """Relaxed top-K GloRo net (Algorithm 7.1, Eq. 7.1): ⊥ unless some top-k set, k ≤ K, is certified.

    ``g_⊥ = max_i f_i − m(x)``, m(x) = max_k m^k(x). ``bottom_gradient="full"`` (default, the reference gloro
    library's later code) lets the gradient flow through max f; ``"stop"`` is the thesis' footnote 2 of ch. 7,
    ``stop_gradient(max_i f_i) − m(x)``, which is unstable: the loss saturates and VRA stays 0 (docs). ``k`` is
    capped at m − 1: the set of all classes is trivially invariant and certifies nothing.
    """

    def __init__(self, model: nn.Module, input_shape: Sequence[int], epsilon: float, k: int, num_iterations: int = 5,
                 variant: Variant = "margin", seed: int = 0, bottom_gradient: BottomGradient = "full") -> None:
        super().__init__(model, input_shape, epsilon, num_iterations, variant, seed)
        if k < 1:
            raise GloroError(f"rtk k must be >= 1, got {k}")
        self.k = min(int(k), self.num_classes - 1)
        self.bottom_gradient = _check_bottom_gradient(bottom_gradient)

    def top_k_margins(self, logits: torch.Tensor, K: torch.Tensor) -> torch.Tensor:
        return _margins_by_k(logits, K, self.epsilon, self.k)

    def bottom(self, logits: torch.Tensor, K: torch.Tensor) -> torch.Tensor:
        return _relaxed_bottom(logits, self.top_k_margins(logits, K), self.bottom_gradient)


class AffinityGloroNet(GloroNet):
    """Affinity GloRo net (Algorithm 7.2, Eq. 7.2–7.3): only top-k sets inside one affinity set may be certified.

    Every class must belong to at least one affinity set (otherwise it could never be certified).
    """

    def __init__(self, model: nn.Module, input_shape: Sequence[int], epsilon: float,
                 affinity_sets: Sequence[Sequence[int]], num_iterations: int = 5, variant: Variant = "margin",
                 seed: int = 0, bottom_gradient: BottomGradient = "full") -> None:
        super().__init__(model, input_shape, epsilon, num_iterations, variant, seed)
        self.bottom_gradient = _check_bottom_gradient(bottom_gradient)
        m = self.num_classes
        if not affinity_sets:
            raise GloroError("affinity_sets: need at least one set of class indices, e.g. [[0], [1, 7], [3, 5, 8]]")
        mask = torch.zeros(len(affinity_sets), m, dtype=torch.bool)
        for s, group in enumerate(affinity_sets):
            for c in group:
                if not 0 <= int(c) < m:
                    raise GloroError(f"affinity_sets[{s}]: class {c} is not in [0, {m - 1}]")
                mask[s, int(c)] = True
        missing = [c for c in range(m) if not mask[:, c].any()]
        if missing:
            raise GloroError(f"affinity_sets: classes {missing} are in no affinity set; add them (e.g. as singletons)")
        self.register_buffer("sets", mask, persistent=False)
        self.k = min(int(mask.sum(1).max()), m - 1)

    def top_k_margins(self, logits: torch.Tensor, K: torch.Tensor) -> torch.Tensor:
        mk = _margins_by_k(logits, K, self.epsilon, self.k)
        rank = logits.argsort(1, descending=True).argsort(1)
        outside = (~self.sets).float()
        valid = []
        for k in range(1, self.k + 1):
            in_top = (rank < k).float()
            valid.append(((in_top @ outside.T) == 0).any(1))  # F^k ⊆ S for some S (bit-mask test)
        return mk.masked_fill(~torch.stack(valid, 1), float("-inf"))

    def bottom(self, logits: torch.Tensor, K: torch.Tensor) -> torch.Tensor:
        return _relaxed_bottom(logits, self.top_k_margins(logits, K), self.bottom_gradient)
