"""Global Lipschitz upper bounds of a layered network (seed 002 §6.2.2–6.3.3, Eq. 6.9, Algorithm 6.1).

``K ≤ Π_j ‖h^j‖``: the product of per-layer ℓ2 bounds. Linear and convolutional layers get their operator norm
by the power method with a *persistent* iterate (a buffer saved with the model): a few iterations per training
step, the gradient flowing through ``‖A x‖`` with ``x`` treated as a constant (§6.3.3). Convolutions apply ``A``
with ``conv2d`` and ``A*`` with ``conv_transpose2d`` at the layer's stride/padding/dilation/groups.

Before certification, :meth:`LipschitzBound.certified` recomputes every operator norm in float64: exactly (the
largest singular value of the explicit matrix, ``torch.linalg.svdvals``) where the matrix is small enough, else by
a *proven upper bound* — never by the power method, whose iterates approach the norm from below:

* Conv2d (:func:`conv_circulant_bound`): the zero-padded convolution (after a polyphase split for strides) is
  ``crop ∘ C ∘ embed`` with ``C`` the circular convolution on the padded grid (no index wraps around before the
  crop), ``embed`` an isometry and ``crop`` a coordinate projection, so ‖conv‖ ≤ ‖C‖ = max over the grid's
  frequencies ω of σ_max(K̂(ω)) (Sedghi et al. 2019), computed exactly by an FFT of the kernel and batched SVDs of
  the C_out × C_in matrices.
* parameter-free linear maps (average pooling; all weights ≥ 0): the Schur test ‖A‖₂ ≤ √(max_i (A1)_i ·
  max_j (Aᵀ1)_j).

Every layer must have a known sound bound: anything else is *refused* with :class:`UnknownLipschitzError` naming
the layer (the TensorFlow library silently uses 1, which is unsound).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from modelward.core.modules import eval_mode, model_device
from modelward.errors import ModelwardError
from modelward.robustness.gloro.layers import InvertibleDownsampling, MinMax, Residual


class GloroError(ModelwardError):
    """A GloRo net cannot be built or certified as configured."""


class UnknownLipschitzError(GloroError):
    """A layer has no known sound Lipschitz bound; GloRo refuses to certify through it."""


# Layers whose ℓ2 Lipschitz constant is a fixed number (permutations, reshapes, 1-Lipschitz activations).
_ONE_LIPSCHITZ = (MinMax, InvertibleDownsampling, nn.ReLU, nn.Tanh, nn.Hardtanh, nn.Identity, nn.Flatten,
                  nn.Unflatten, nn.PixelUnshuffle, nn.PixelShuffle, nn.Softplus, nn.ReLU6)
_EXACT_LIMIT = 4_000_000  # max entries of an explicit operator matrix for the exact (SVD) norm


@dataclass(frozen=True)
class LayerNorm:
    """One layer's certified bound: name, module type, how it was obtained and the value."""

    name: str
    kind: str
    method: str
    value: float


class _Bound(nn.Module):
    """Bound of one layer. ``value(n_iter)`` is differentiable w.r.t. the layer's parameters."""

    name: str

    def value(self, n_iter: int = 0) -> torch.Tensor:
        raise NotImplementedError

    def certified(self, tol: float, max_iter: int, exact_limit: int) -> list[LayerNorm]:
        raise NotImplementedError


class ConstantBound(_Bound):
    def __init__(self, name: str, module: nn.Module, c: float) -> None:
        super().__init__()
        self.name, self.kind, self.c = name, type(module).__name__, float(c)
        # a (non-persistent) buffer, so the constant follows the bound's .to(device) instead of living on the CPU
        self.register_buffer("c_t", torch.tensor(self.c), persistent=False)

    def value(self, n_iter: int = 0) -> torch.Tensor:
        return self.c_t

    def certified(self, tol: float, max_iter: int, exact_limit: int) -> list[LayerNorm]:
        return [LayerNorm(self.name, self.kind, "constant", self.c)]


class _PowerBound(_Bound):
    """Operator norm of a linear map ``A`` (bias ignored) by Algorithm 6.1 with a persistent iterate ``u``."""

    def __init__(self, name: str, module: nn.Module, in_shape: tuple[int, ...], seed: int) -> None:
        super().__init__()
        self.name, self.module_ref = name, [module]  # list: do not register the layer as a submodule twice
        self.kind = type(module).__name__
        self.in_shape = tuple(in_shape)
        g = torch.Generator().manual_seed(seed)
        # drawn on the CPU (the same start on every device), then put where the layer's weights are
        u = torch.randn((1, *in_shape), generator=g).to(model_device(module))
        self.register_buffer("u", u / u.norm())

    @property
    def module(self) -> nn.Module:
        return self.module_ref[0]

    def apply(self, x: torch.Tensor, double: bool = False) -> torch.Tensor:
        raise NotImplementedError

    def adjoint(self, y: torch.Tensor, double: bool = False) -> torch.Tensor:
        raise NotImplementedError

    @torch.no_grad()
    def step(self, n: int, double: bool = False) -> torch.Tensor:
        """Run ``n`` power iterations ``u ← A*A u / ‖A*A u‖`` from the stored iterate; store and return it."""
        u = self.u.double() if double else self.u.clone()
        for _ in range(n):
            u = self.adjoint(self.apply(u, double), double)
            u = u / u.norm().clamp_min(1e-30)
        self.u.copy_(u.to(self.u.dtype))
        return u

    def value(self, n_iter: int = 0) -> torch.Tensor:
        if n_iter:
            self.step(n_iter)
        u = self.u.detach()
        return self.apply(u).norm() / u.norm().clamp_min(1e-30)

    @torch.no_grad()
    def converge(self, tol: float = 1e-7, max_iter: int = 5000) -> tuple[float, int]:
        """Power method in float64 until the cosine between successive iterates is within ``tol`` of 1."""
        u = self.u.double()
        u = u / u.norm().clamp_min(1e-30)
        it = 0
        for it in range(1, max_iter + 1):  # noqa: B007
            v = self.adjoint(self.apply(u, True), True)
            v = v / v.norm().clamp_min(1e-30)
            cos = float((u * v).sum())
            u = v
            if cos >= 1.0 - tol:
                break
        self.u.copy_(u.to(self.u.dtype))
        return float(self.apply(u, True).norm()), it

    @torch.no_grad()
    def matrix(self) -> torch.Tensor:
        """The explicit matrix of ``A`` (rows = outputs), built by applying ``A`` to the standard basis."""
        n = math.prod(self.in_shape)
        basis = torch.eye(n, dtype=torch.float64, device=self.u.device).view(n, *self.in_shape)
        return self.apply(basis, True).reshape(n, -1).T

    def n_out(self) -> int:
        with torch.no_grad():
            return self.apply(self.u).numel()

    def certified(self, tol: float, max_iter: int, exact_limit: int) -> list[LayerNorm]:
        n_in = math.prod(self.in_shape)
        if n_in * self.n_out() <= exact_limit:
            val = float(torch.linalg.svdvals(self.matrix())[0])
            self.converge(tol, max_iter)  # keep the stored iterate converged for later training/inference
            return [LayerNorm(self.name, self.kind, "exact", val)]
        self.converge(tol, max_iter)  # the iterate is for training only: a lower estimate never certifies
        method, val = self.upper_bound()
        return [LayerNorm(self.name, self.kind, method, val)]

    def upper_bound(self) -> tuple[str, float]:
        """A proven upper bound on the operator norm, for layers too large for the exact SVD."""
        raise NotImplementedError


class LinearBound(_PowerBound):
    def apply(self, x: torch.Tensor, double: bool = False) -> torch.Tensor:
        w = self.module.weight
        return F.linear(x, w.double() if double else w)

    def adjoint(self, y: torch.Tensor, double: bool = False) -> torch.Tensor:
        w = self.module.weight
        return F.linear(y, (w.double() if double else w).T)

    def certified(self, tol: float, max_iter: int, exact_limit: int) -> list[LayerNorm]:
        w = self.module.weight.detach().double()
        self.converge(tol, max_iter)
        return [LayerNorm(self.name, self.kind, "exact", float(torch.linalg.matrix_norm(w, 2)))]


class ConvBound(_PowerBound):
    """``A`` = conv2d, ``A*`` = conv_transpose2d with the same stride/padding/dilation/groups."""

    def __init__(self, name: str, module: nn.Conv2d, in_shape: tuple[int, ...], seed: int) -> None:
        if module.padding_mode != "zeros":
            raise UnknownLipschitzError(
                f"layer '{name}' (Conv2d, padding_mode={module.padding_mode!r}): only zero padding is supported")
        pad = module.padding
        if isinstance(pad, str):
            if pad == "valid":
                pad = (0, 0)
            else:  # 'same' (stride 1): symmetric only when dilation*(k-1) is even
                tot = [d * (k - 1) for d, k in zip(module.dilation, module.kernel_size, strict=True)]
                if any(t % 2 for t in tot):
                    raise UnknownLipschitzError(
                        f"layer '{name}' (Conv2d, padding='same' with an even kernel): asymmetric padding is not "
                        "supported; use a numeric padding")
                pad = (tot[0] // 2, tot[1] // 2)
        self.pad = tuple(pad)
        super().__init__(name, module, in_shape, seed)
        with torch.no_grad():
            out = self.apply(self.u)
            full = F.conv_transpose2d(out, module.weight, None, module.stride, self.pad, 0, module.groups,
                                      module.dilation)
        self.output_padding = tuple(int(a - b) for a, b in zip(in_shape[1:], full.shape[2:], strict=True))

    def apply(self, x: torch.Tensor, double: bool = False) -> torch.Tensor:
        m = self.module
        w = m.weight.double() if double else m.weight
        return F.conv2d(x, w, None, m.stride, self.pad, m.dilation, m.groups)

    def adjoint(self, y: torch.Tensor, double: bool = False) -> torch.Tensor:
        m = self.module
        w = m.weight.double() if double else m.weight
        return F.conv_transpose2d(y, w, None, m.stride, self.pad, self.output_padding, m.groups, m.dilation)

    def upper_bound(self) -> tuple[str, float]:
        m = self.module
        return "circulant-fft", conv_circulant_bound(m.weight.detach(), self.in_shape[1:], self.pad, m.dilation,
                                                     m.groups, m.stride)


class AutogradLinearBound(_PowerBound):
    """Any parameter-free linear map (average pooling): ``A*`` through autograd's vector-Jacobian product."""

    def apply(self, x: torch.Tensor, double: bool = False) -> torch.Tensor:
        return self.module(x)

    def adjoint(self, y: torch.Tensor, double: bool = False) -> torch.Tensor:
        with torch.enable_grad():
            x = torch.zeros((y.shape[0], *self.in_shape), dtype=y.dtype, device=y.device, requires_grad=True)
            (g,) = torch.autograd.grad(self.module(x), x, y)
        return g

    @torch.no_grad()
    def upper_bound(self) -> tuple[str, float]:
        # Schur test for a matrix with non-negative entries (average pooling): ‖A‖₂² ≤ ‖A‖₁‖A‖∞, and for A ≥ 0 the
        # row / column sums are A·1 and Aᵀ·1
        ones = torch.ones((1, *self.in_shape), dtype=torch.float64, device=self.u.device)
        rows = self.apply(ones, True)
        cols = self.adjoint(torch.ones_like(rows), True)
        return "schur", math.sqrt(float(rows.max()) * float(cols.max()))


class BatchNormBound(_Bound):
    """BatchNorm in eval mode is a per-channel affine map: bound = max |γ| / sqrt(running_var + eps)."""

    def __init__(self, name: str, module: nn.modules.batchnorm._BatchNorm) -> None:
        super().__init__()
        self.name, self.module_ref, self.kind = name, [module], type(module).__name__
        if not module.track_running_stats:
            raise UnknownLipschitzError(f"layer '{name}' ({self.kind}) uses batch statistics at inference: "
                                        "its Lipschitz constant depends on the batch")

    def value(self, n_iter: int = 0) -> torch.Tensor:
        m = self.module_ref[0]
        if m.training:
            raise GloroError(f"layer '{self.name}' ({self.kind}): BatchNorm is not compatible with GloRo training "
                             "(seed 002 §6.3.2); use an architecture without BatchNorm")
        scale = torch.rsqrt(m.running_var + m.eps)
        if m.weight is not None:
            scale = scale * m.weight
        return scale.abs().max()

    def certified(self, tol: float, max_iter: int, exact_limit: int) -> list[LayerNorm]:
        with torch.no_grad():
            return [LayerNorm(self.name, self.kind, "exact", float(self.value()))]


class SequenceBound(_Bound):
    """Product of the bounds of a sequence of layers (Eq. 6.9)."""

    def __init__(self, name: str, parts: list[_Bound]) -> None:
        super().__init__()
        self.name, self.parts = name, nn.ModuleList(parts)
        self.register_buffer("one", torch.tensor(1.0), persistent=False)  # follows .to(device)

    def value(self, n_iter: int = 0) -> torch.Tensor:
        out = self.one
        for p in self.parts:
            out = out * p.value(n_iter)
        return out

    def certified(self, tol: float, max_iter: int, exact_limit: int) -> list[LayerNorm]:
        return [r for p in self.parts for r in p.certified(tol, max_iter, exact_limit)]


class ResidualBound(_Bound):
    """``branch + skip``: L ≤ L(branch) + L(skip)."""

    def __init__(self, name: str, branch: SequenceBound, skip: SequenceBound) -> None:
        super().__init__()
        self.name, self.branch, self.skip = name, branch, skip

    def value(self, n_iter: int = 0) -> torch.Tensor:
        return self.branch.value(n_iter) + self.skip.value(n_iter)

    def certified(self, tol: float, max_iter: int, exact_limit: int) -> list[LayerNorm]:
        b = self.branch.certified(tol, max_iter, exact_limit)
        s = self.skip.certified(tol, max_iter, exact_limit)
        total = math.prod(r.value for r in b) + math.prod(r.value for r in s)
        return [LayerNorm(self.name, "Residual", "sum of branches", total)]


@torch.no_grad()
def conv_circulant_bound(weight: torch.Tensor, spatial: tuple[int, ...], padding: tuple[int, int],
                         dilation: tuple[int, int] | int = 1, groups: int = 1,
                         stride: tuple[int, int] | int = 1) -> float:
    """Proven upper bound on the ℓ2 operator norm of a zero-padded 2-D convolution on ``spatial``.

    Stride 1: with the input zero-padded to N = H + 2p (per axis), output index i reads padded positions
    i + d·a ≤ N − 1, so the convolution equals the circular convolution on the N-grid followed by a crop (a
    coordinate projection), and embedding x into the padded grid is an isometry. The circular convolution is
    block-diagonalised by the 2-D DFT, so its norm is max_ω σ_max(K̂(ω)) over the grid's frequencies, K̂(ω) the
    C_out × C_in matrix of the kernel's DFT (Sedghi et al. 2019).
    Stride s: the polyphase decomposition y[i] = Σ_r Σ_q w[s·q + r]·x_pad[s·(i + q) + r] turns it into a stride-1
    convolution of the s_h·s_w phase images of x_pad (a permutation of its entries, zero-extended to a multiple of
    s) with kernel ⌈k/s⌉, whose reads stay below ⌈N/s⌉; the same argument applies on that grid. This is much
    tighter than bounding the stride-1 convolution and sub-sampling. Float64.

    Args:
        weight: (C_out, C_in / groups, k_h, k_w) kernel.
        spatial: input (H, W).
        padding: symmetric zero padding (p_h, p_w).
        dilation, groups, stride: as in ``nn.Conv2d`` (groups are expanded into a block-diagonal kernel).

    Returns:
        An upper bound ≥ the exact operator norm.

    Example:
        >>> conv = nn.Conv2d(2, 3, 3, padding=1)
        >>> conv_circulant_bound(conv.weight, (8, 8), (1, 1)) >= 0
        True
    """
    dil, st = nn.modules.utils._pair(dilation), nn.modules.utils._pair(stride)
    w = weight.detach().double().cpu()
    c_out, c_in_g, kh, kw = w.shape
    if groups > 1:  # block-diagonal dense kernel
        dense = torch.zeros(c_out, c_in_g * groups, kh, kw, dtype=torch.float64)
        per = c_out // groups
        for g in range(groups):
            dense[g * per:(g + 1) * per, g * c_in_g:(g + 1) * c_in_g] = w[g * per:(g + 1) * per]
        w = dense
    c_in = w.shape[1]
    ke_h, ke_w = dil[0] * (kh - 1) + 1, dil[1] * (kw - 1) + 1
    qh, qw = -(-ke_h // st[0]), -(-ke_w // st[1])  # polyphase kernel size ⌈k_e/s⌉
    wd = torch.zeros(c_out, c_in, qh * st[0], qw * st[1], dtype=torch.float64)
    wd[:, :, : ke_h : dil[0], : ke_w : dil[1]] = w
    # polyphase: channel (c, r_h, r_w), tap (q_h, q_w) = wd[..., s_h·q_h + r_h, s_w·q_w + r_w]
    wp = wd.view(c_out, c_in, qh, st[0], qw, st[1]).permute(0, 1, 3, 5, 2, 4).reshape(c_out, -1, qh, qw)
    n_h = max(-(-(spatial[0] + 2 * padding[0]) // st[0]), qh)
    n_w = max(-(-(spatial[1] + 2 * padding[1]) // st[1]), qw)
    grid = torch.zeros(c_out, wp.shape[1], n_h, n_w, dtype=torch.float64)
    grid[:, :, :qh, :qw] = wp
    spec = torch.fft.fft2(grid).permute(2, 3, 0, 1).reshape(n_h * n_w, c_out, wp.shape[1])
    best = 0.0
    for s in range(0, spec.shape[0], 256):  # bounded memory for the batched SVDs
        best = max(best, float(torch.linalg.svdvals(spec[s:s + 256]).max()))
    return best


def _leaf_bound(name: str, m: nn.Module, shape: tuple[int, ...], seed: int) -> _Bound:
    if isinstance(m, nn.Linear):
        return LinearBound(name, m, shape, seed)
    if isinstance(m, nn.Conv2d):
        return ConvBound(name, m, shape, seed)
    if isinstance(m, (nn.AvgPool2d, nn.AdaptiveAvgPool2d, nn.AvgPool1d)):
        return AutogradLinearBound(name, m, shape, seed)
    if isinstance(m, nn.MaxPool2d):
        k = nn.modules.utils._pair(m.kernel_size)
        s = nn.modules.utils._pair(m.stride if m.stride is not None else m.kernel_size)
        d = nn.modules.utils._pair(m.dilation)
        # |max(a) - max(b)| ≤ max|a - b|; each input lies in at most Π ceil(span/stride) windows
        cover = math.prod(math.ceil(((kk - 1) * dd + 1) / ss) if dd == 1 else kk for kk, ss, dd in zip(k, s, d,
                                                                                                         strict=True))
        return ConstantBound(name, m, math.sqrt(cover))
    if isinstance(m, _ONE_LIPSCHITZ):
        return ConstantBound(name, m, 1.0)
    if isinstance(m, nn.LeakyReLU):
        return ConstantBound(name, m, max(1.0, abs(m.negative_slope)))
    if isinstance(m, nn.ELU):
        return ConstantBound(name, m, max(1.0, m.alpha))
    if isinstance(m, nn.Sigmoid):
        return ConstantBound(name, m, 0.25)
    if isinstance(m, nn.Dropout):
        return ConstantBound(name, m, 1.0 / (1.0 - m.p) if m.p < 1 else 0.0)
    if isinstance(m, nn.modules.batchnorm._BatchNorm):
        return BatchNormBound(name, m)
    raise UnknownLipschitzError(
        f"layer '{name}' ({type(m).__name__}) has no known Lipschitz bound, so GloRo refuses to certify the "
        "network (an unknown layer is never assumed 1-Lipschitz). Supported: Linear, Conv2d (zero padding), "
        "MinMax, ReLU/LeakyReLU/Tanh/Sigmoid/ELU, Flatten, MaxPool2d, AvgPool2d, InvertibleDownsampling, "
        "BatchNorm (eval only), Dropout, Residual, nested nn.Sequential"
    )


def _build(prefix: str, modules: list[tuple[str, nn.Module]], shape: tuple[int, ...], seed: int
           ) -> tuple[SequenceBound, tuple[int, ...]]:
    parts: list[_Bound] = []
    x = torch.zeros((1, *shape), device=model_device(nn.ModuleList(m for _, m in modules)))
    for name, m in modules:
        full = f"{prefix}{name}"
        if isinstance(m, nn.Sequential):
            sub, _ = _build(f"{full}.", list(m.named_children()), tuple(x.shape[1:]), seed + len(parts) * 7919)
            parts.append(sub)
        elif isinstance(m, Residual):
            b, _ = _build(f"{full}.branch.", [("", m.branch)], tuple(x.shape[1:]), seed + 1)
            s, _ = _build(f"{full}.skip.", [("", m.skip)], tuple(x.shape[1:]), seed + 2)
            parts.append(ResidualBound(full, b, s))
        else:
            parts.append(_leaf_bound(full.rstrip("."), m, tuple(x.shape[1:]), seed + len(parts) * 7919))
        with torch.no_grad():
            x = _forward_shape(m, x)
    return SequenceBound(prefix.rstrip("."), parts), tuple(x.shape[1:])


def _forward_shape(m: nn.Module, x: torch.Tensor) -> torch.Tensor:
    with eval_mode(m):
        return m(x)


class LipschitzBound(nn.Module):
    """Upper bound on the ℓ2 Lipschitz constant of ``layers`` (a list of (name, module)) applied in order."""

    def __init__(self, layers: list[tuple[str, nn.Module]], input_shape: tuple[int, ...], seed: int = 0) -> None:
        super().__init__()
        self.seq, self.output_shape = _build("", layers, tuple(input_shape), seed)
        self.to(model_device(nn.ModuleList(m for _, m in layers)))  # constants of parameter-free layers follow the model

    def forward(self, n_iter: int = 0) -> torch.Tensor:
        """Differentiable bound from the stored iterates after ``n_iter`` further power iterations per layer."""
        return self.seq.value(n_iter)

    @torch.no_grad()
    def converge(self, tol: float = 1e-5, max_iter: int = 1000) -> None:
        """Run every layer's power method to convergence (the per-epoch refresh of App. A.4)."""
        for m in self.modules():
            if isinstance(m, _PowerBound):
                m.converge(tol, max_iter)

    def certified(self, tol: float = 1e-9, max_iter: int = 5000, exact_limit: int = _EXACT_LIMIT
                  ) -> tuple[float, list[LayerNorm]]:
        """Float64 bound for certification (exact SVD where affordable, else converged power method)."""
        per_layer = self.seq.certified(tol, max_iter, exact_limit)
        return math.prod(r.value for r in per_layer), per_layer


def operator_norm(layer: nn.Linear | nn.Conv2d, input_shape: tuple[int, ...], n_iter: int = 100,
                  seed: int = 0) -> float:
    """Spectral norm of one linear/conv layer by ``n_iter`` power iterations (Algorithm 6.1)."""
    b = _leaf_bound("layer", layer, tuple(input_shape), seed)
    if not isinstance(b, _PowerBound):
        raise GloroError(f"operator_norm: {type(layer).__name__} is not a linear/conv layer")
    b.step(n_iter)
    with torch.no_grad():
        return float(b.value())
