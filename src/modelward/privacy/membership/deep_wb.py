"""Deep white-box attack (seed 002 §8.3.1, Algorithm 8.3, Eq. 8.12) with a meta model over layers (§8.3.2).

Per slice f = g ∘ h, keep the target's own representation z = ĥ(x) and linearise the top at each point with
**internal influence** under the Integrated-Gradients distribution of interest (uniform on the segment [0, z]):

    χ_y(g, z) = ∫₀¹ ∂g_y/∂z (α z) dα      (Riemann midpoint sum with ``ig_steps`` points)
    m^y(x) = σ( (χ_y(ĝ, z) − χ_y(g̃, z))ᵀ z + ĝ(0)_y − g̃(0)_y )

with g̃ a copy of the top architecture trained on the target's features of hold-out data (the mean over
``proxies`` proxy tops). By completeness (Eq. 8.12) χ_y(g, z)ᵀz + g(0)_y = g_y(z), so with exact IG the score is
ĝ_y(z) − g̃_y(z); for a linear top it is exactly bayesian-wb (Alg. 8.1).

Meta model (§8.3.2): the per-layer log-odds (m_1, …, m_L) feed a dense net (16 hidden units, Adam, 32 epochs, BCE).
Its training set comes from ``shadows`` shadow targets, each trained with the target's algorithm on a third of a
random split of the hold-out (S̃¹); per layer, proxies of *that shadow's* tops are trained on a second third
(S̃ᵖ) and the per-layer scores on S̃¹ (label 1) and the last third S̃⁰ (label 0) form the rows. (The thesis splits
S̃ in two; the third part keeps label-0 points out of the proxies' training data, as at attack time.)
"""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from modelward.errors import ConfigError
from modelward.privacy.membership.base import AttackData, MembershipAttack
from modelward.privacy.membership.proxies import train_tops
from modelward.privacy.slicing import Side, Top, features, get_layer, last_linear


def default_slices(model: nn.Module) -> list[tuple[str, Side]]:
    """Every parametrised layer's output except the last layer's, then the input of the last linear layer."""
    last = last_linear(model)
    out: list[tuple[str, Side]] = []
    for n, m in model.named_modules():
        if n and not list(m.children()) and isinstance(m, nn.Linear | nn.Conv2d | nn.Conv1d) and n != last:
            out.append((n, "output"))
    return out + [(last, "input")]


def influence(top: Top, z: torch.Tensor, y: torch.Tensor, steps: int = 32) -> torch.Tensor:
    """χ_y(g, z) = mean_k ∂g_y/∂z ((k + ½)/K · z): internal influence with the IG distribution (Def. 3.2)."""
    alphas = (torch.arange(steps, dtype=z.dtype) + 0.5) / steps
    total = torch.zeros_like(z)
    for a in alphas:
        zz = (a * z).detach().requires_grad_(True)
        with torch.enable_grad():
            out = top(zz).gather(1, y[:, None]).sum()
            (g,) = torch.autograd.grad(out, zz)
        total += g
    return total / steps


def layer_scores(net: nn.Module, tops: list[Top], layer: str, side: Side, x: torch.Tensor, y: torch.Tensor,
                 steps: int, exact: bool = False, batch: int = 512) -> np.ndarray:
    """Alg. 8.3's log-odds on ``net`` sliced at ``layer`` against the mean of the proxy tops ``tops``."""
    top = Top.of(net, layer, x[:1], side)
    out = []
    for i in range(0, len(x), batch):
        xb, yb = x[i:i + batch], y[i:i + batch]
        z = features(net, layer, xb, side)
        zero = torch.zeros_like(z)
        with torch.no_grad():
            g0 = top(zero).gather(1, yb[:, None])[:, 0]
            p0 = torch.stack([t(zero).gather(1, yb[:, None])[:, 0] for t in tops]).mean(0)
        if exact:  # completeness: χᵀz + g(0) = g(z)
            with torch.no_grad():
                s = top(z).gather(1, yb[:, None])[:, 0] - torch.stack(
                    [t(z).gather(1, yb[:, None])[:, 0] for t in tops]).mean(0)
        else:
            chi_t = influence(top, z, yb, steps)
            chi_p = torch.stack([influence(t, z, yb, steps) for t in tops]).mean(0)
            s = ((chi_t - chi_p) * z).sum(1) + g0 - p0
        out.append(s.detach().double().numpy())
    return np.concatenate(out) if out else np.zeros(0)


class _Meta(nn.Module):
    def __init__(self, n_in: int, hidden: int) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Linear(n_in, hidden), nn.ReLU(), nn.Linear(hidden, 1))

    def forward(self, s: torch.Tensor) -> torch.Tensor:
        return self.net(s)[:, 0]


class DeepWB(MembershipAttack):
    """Args:
        slices: [(layer, "input"|"output")] to attack (default: :func:`default_slices`); one slice ⇒ no meta model.
        proxies: proxy tops per slice (mean of their influences); shadows: shadow targets for the meta model.
        ig_steps: Riemann points of the IG integral; exact: use the completeness identity instead (faster).
        meta_hidden / meta_epochs / meta_lr: the meta model (thesis: 16 hidden, 32 epochs, Adam).
    Example:
        >>> a = DeepWB(shadows=10).fit(AttackData(cnn, x_hold, y_hold, 10, trainer=A))
        >>> a.score(x, y)    # the meta model's log-odds
    """

    name = "deep_wb"
    threshold = 0.0

    def __init__(self, slices: list[tuple[str, str]] | None = None, proxies: int = 3, shadows: int = 10,
                 ig_steps: int = 32, exact: bool = False, meta_hidden: int = 16, meta_epochs: int = 32,
                 meta_lr: float = 1e-3) -> None:
        if proxies < 1 or shadows < 1 or ig_steps < 1:
            raise ConfigError("deep_wb: proxies, shadows and ig_steps must be >= 1")
        for s in slices or []:
            if len(s) != 2 or s[1] not in ("input", "output"):
                raise ConfigError(f"deep_wb.slices: each entry is [layer, 'input'|'output'], got {s!r}")
        self.slices = [(str(a), b) for a, b in slices] if slices else None  # type: ignore[misc]
        self.proxies, self.shadows, self.ig_steps, self.exact = proxies, shadows, ig_steps, exact
        self.meta_hidden, self.meta_epochs, self.meta_lr = meta_hidden, meta_epochs, meta_lr

    def _tops(self, data: AttackData, net: nn.Module, x: torch.Tensor, y: torch.Tensor, seed: int
              ) -> list[list[Top]]:
        out = []
        for j, (layer, side) in enumerate(self.slices or []):
            get_layer(net, layer)
            out.append(_train_side(data, net, x, y, layer, side, self.proxies, seed * 101 + j))
        return out

    def _scores(self, net: nn.Module, tops: list[list[Top]], x: torch.Tensor, y: torch.Tensor) -> np.ndarray:
        return np.stack([layer_scores(net, t, layer, side, x, y, self.ig_steps, self.exact)
                         for t, (layer, side) in zip(tops, self.slices or [], strict=True)], 1)

    def fit(self, data: AttackData) -> DeepWB:
        self.data = data
        if self.slices is None:
            self.slices = default_slices(data.target)
        trainer = data.need_trainer("deep_wb")
        self.target_tops = self._tops(data, data.target, data.x_aux, data.y_aux, data.seed)
        self.meta: _Meta | None = None
        if len(self.slices) == 1:
            return self
        rng = np.random.default_rng(data.seed + 23)
        feats, labels = [], []
        for i in range(self.shadows):
            perm = torch.as_tensor(rng.permutation(len(data.x_aux)))
            k = len(perm) // 3
            s1, s0, sp = perm[:k], perm[k:2 * k], perm[2 * k:]
            shadow = trainer.train(data.x_aux[s1], data.y_aux[s1], data.seed * 1009 + i)
            tops = self._tops(data, shadow, data.x_aux[sp], data.y_aux[sp], data.seed * 1009 + i)
            for idx, lab in ((s1, 1.0), (s0, 0.0)):
                feats.append(self._scores(shadow, tops, data.x_aux[idx], data.y_aux[idx]))
                labels.append(np.full(len(idx), lab))
        S = np.concatenate(feats)
        self.mu, self.sd = S.mean(0), S.std(0) + 1e-9
        X = torch.as_tensor((S - self.mu) / self.sd, dtype=torch.float32)
        L = torch.as_tensor(np.concatenate(labels), dtype=torch.float32)
        g = torch.Generator().manual_seed(data.seed + 5)
        self.meta = _Meta(X.shape[1], self.meta_hidden)
        with torch.no_grad():
            for p in self.meta.parameters():
                p.uniform_(-1 / X.shape[1] ** 0.5, 1 / X.shape[1] ** 0.5, generator=g)
        opt = torch.optim.Adam(self.meta.parameters(), lr=self.meta_lr)
        for _ in range(self.meta_epochs):
            perm = torch.randperm(len(L), generator=g)
            for j in range(0, len(L), 32):
                b = perm[j:j + 32]
                loss = F.binary_cross_entropy_with_logits(self.meta(X[b]), L[b])
                opt.zero_grad(set_to_none=True)
                loss.backward()
                opt.step()
        return self

    def layer_scores(self, x: torch.Tensor, y: torch.Tensor) -> np.ndarray:
        """(n, L) per-slice log-odds on the target."""
        return self._scores(self.data.target, self.target_tops, x, y)

    def score(self, x: torch.Tensor, y: torch.Tensor) -> np.ndarray:
        S = self.layer_scores(x, y)
        if self.meta is None:
            return S[:, 0]
        with torch.no_grad():
            return self.meta(torch.as_tensor((S - self.mu) / self.sd, dtype=torch.float32)).double().numpy()


def _train_side(data: AttackData, net: nn.Module, x: torch.Tensor, y: torch.Tensor, layer: str, side: Side,
                count: int, seed: int) -> list[Top]:
    return train_tops(data, x, y, layer, count, True, seed, target=net, side=side)
