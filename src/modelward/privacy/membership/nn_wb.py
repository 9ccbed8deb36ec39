"""nn-wb (seed 002 §8.2.2, Fig. 8.5, Algorithm 8.2): a learned element-wise displacement instead of subtraction.

bayesian-wb computes w^y = d(Ŵ_y, W̃_y) with d(v, u) = v − u element-wise. nn-wb learns d: R × R → R — a 1-D conv
with kernel 2 / stride 2 over the interleaved pairs (ŵ_j, w̃_j) followed by kernel-1 layers, i.e. a tiny MLP on
each (target weight, proxy weight) pair, shared over coordinates and also applied to the bias pair:

    Pr[member | x, y] = σ(D(Ŵ_y, W̃_y)ᵀ z + D(b̂_y, b̃_y)),  z = ĥ(x)

Training data (the intended reading of the garbled Alg. 8.2 line 6, digest §2.3): for i ∈ [N] random splits
S̃ = S̃¹ ∪ S̃⁰ of the hold-out, a shadow target top on S̃¹ and a proxy top on S̃⁰; points of S̃¹ are labelled 1,
of S̃⁰ 0. ``variant="three_way"`` (an ablation the digest suggests) trains the proxy on a third part instead, so
label-0 points are not the proxy's own training points. D is fitted with BCE (the 0-1 loss' surrogate), Adam,
32 epochs. At attack time the proxy is trained on all of S̃. ``hidden=0`` is the "min capacity" D (a weighted sum
of the two weights, able to represent subtraction exactly); ``hidden=16`` the "extra capacity" of Table 8.6.
"""

from __future__ import annotations

from typing import Literal

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from modelward.errors import ConfigError
from modelward.privacy.membership.base import AttackData, MembershipAttack
from modelward.privacy.membership.proxies import cached_tops, train_tops_on
from modelward.privacy.slicing import features, get_layer, last_linear


class Displacement(nn.Module):
    """d(v, u): Conv1d(1→h, kernel 2, stride 2) → ReLU → Conv1d(h→1, kernel 1), or Conv1d(1→1, 2, 2) if h = 0."""

    def __init__(self, hidden: int = 0) -> None:
        super().__init__()
        if hidden == 0:
            self.net = nn.Conv1d(1, 1, 2, stride=2, bias=False)
        else:
            self.net = nn.Sequential(nn.Conv1d(1, hidden, 2, stride=2), nn.ReLU(), nn.Conv1d(hidden, 1, 1))

    def forward(self, v: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
        """v, u: (..., d) → (..., d): d applied to each interleaved pair (v_j, u_j)."""
        shape = v.shape
        pairs = torch.stack([v, u], -1).reshape(-1, 1, 2 * shape[-1])
        return self.net(pairs).reshape(shape)


def _wb(top: torch.nn.Module, layer: str) -> tuple[torch.Tensor, torch.Tensor]:
    lin = get_layer(top.model, layer)
    b = lin.bias if lin.bias is not None else torch.zeros(lin.out_features)
    return lin.weight.detach().float(), b.detach().float()


class NNWB(MembershipAttack):
    """Args:
        splits: N shadow/proxy splits of the hold-out (training data for D; thesis: 10).
        hidden: hidden units of d (0 = min capacity). epochs, lr, batch_size: Adam fit of D (thesis: 32 epochs).
        variant: ``"text"`` (proxy on S̃⁰) or ``"three_way"``. layer: the last linear layer (default).
    Example:
        >>> a = NNWB(splits=10, hidden=0).fit(data); a.score(x, y)
    """

    name = "nn_wb"
    threshold = 0.0

    def __init__(self, splits: int = 10, hidden: int = 0, epochs: int = 32, lr: float = 1e-2, batch_size: int = 64,
                 variant: Literal["text", "three_way"] = "text", layer: str | None = None) -> None:
        if splits < 1 or hidden < 0 or epochs < 1:
            raise ConfigError("nn_wb: splits >= 1, hidden >= 0, epochs >= 1 required")
        if variant not in ("text", "three_way"):
            raise ConfigError(f"nn_wb.variant {variant!r}: valid choices: text, three_way")
        self.splits, self.hidden, self.epochs, self.lr, self.bs = splits, hidden, epochs, lr, batch_size
        self.variant, self.layer = variant, layer

    def fit(self, data: AttackData) -> NNWB:
        self.data = data
        layer = self.layer or last_linear(data.target)
        self.layer = layer
        rng = np.random.default_rng(data.seed + 17)
        z_all = features(data.target, layer, data.x_aux).float()
        splits = []
        for _ in range(self.splits):
            perm = rng.permutation(len(data.x_aux))
            if self.variant == "text":
                s1, s0 = perm[: len(perm) // 2], perm[len(perm) // 2:]
                sp = s0
            else:
                k = len(perm) // 3
                s1, s0, sp = perm[:k], perm[k:2 * k], perm[2 * k:]
            splits.append((s1, s0, sp))
        # all shadow-target and proxy tops of all splits in one (stacked) training
        sets = [s for s1, _, sp in splits for s in (s1, sp)]
        tops = train_tops_on(data, data.x_aux, data.y_aux, layer, sets,
                             [data.seed * 31 + k for k in range(len(sets))])
        rows: list[tuple[torch.Tensor, ...]] = []
        for i, (s1, s0, _) in enumerate(splits):
            (Ws, bs), (Wp, bp) = _wb(tops[2 * i], layer), _wb(tops[2 * i + 1], layer)
            for ix, lab in ((s1, 1.0), (s0, 0.0)):
                idx = torch.as_tensor(ix)
                yy = data.y_aux[idx]
                rows.append((Ws[yy], Wp[yy], bs[yy], bp[yy], z_all[idx], torch.full((len(idx),), lab)))
        Wv, Wu, bv, bu, Z, L = (torch.cat(c) for c in zip(*rows, strict=True))
        g = torch.Generator().manual_seed(data.seed + 99)
        self.d = Displacement(self.hidden)
        for p in self.d.parameters():  # seeded init (no global RNG)
            with torch.no_grad():
                p.uniform_(-0.5, 0.5, generator=g)
        opt = torch.optim.Adam(self.d.parameters(), lr=self.lr)
        n = len(L)
        for _ in range(self.epochs):
            perm = torch.randperm(n, generator=g)
            for j in range(0, n, self.bs):
                b = perm[j:j + self.bs]
                logit = (self.d(Wv[b], Wu[b]) * Z[b]).sum(1) + self.d(bv[b, None], bu[b, None])[:, 0]
                loss = F.binary_cross_entropy_with_logits(logit, L[b])
                opt.zero_grad(set_to_none=True)
                loss.backward()
                opt.step()
        _, (final,) = cached_tops(data, layer, 1, False)
        lin = get_layer(data.target, layer)
        Wt = lin.weight.detach().float()
        bt = (lin.bias if lin.bias is not None else torch.zeros(lin.out_features)).detach().float()
        Wf, bf = _wb(final, layer)
        with torch.no_grad():
            self.w = self.d(Wt, Wf).double().numpy()
            self.b = self.d(bt[:, None], bf[:, None])[:, 0].double().numpy()
        return self

    def score(self, x: torch.Tensor, y: torch.Tensor) -> np.ndarray:
        z = features(self.data.target, self.layer, x).double().numpy()
        yy = np.asarray(y).astype(int)
        return (self.w[yy] * z).sum(1) + self.b[yy]
