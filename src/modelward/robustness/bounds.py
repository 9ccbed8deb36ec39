"""Bound propagation certificates: IBP and CROWN for Linear / Conv2d / ReLU / Flatten / BatchNorm (eval) nets.

- **IBP** (interval bound propagation; Gowal et al. 2018, eq. 6): boxes pushed layer by layer, an affine layer
  maps centre ``c`` and radius ``r`` to ``Wc + b`` and ``|W| r``; ReLU is monotone.
- **CROWN** (Zhang, Weng, Chen, Hsieh, Daniel, NeurIPS 2018, Theorem 3.2): every ReLU with pre-activation bounds
  ``l < 0 < u`` is enclosed by the upper line ``u(h − l)/(u − l)`` and the adaptive lower line ``α h`` (α = 1 if
  ``u ≥ −l`` else 0); a linear function of the output is propagated backwards through these lines to the input and
  minimised in closed form over the input set. Intermediate bounds are CROWN bounds themselves (for the neurons
  IBP leaves unstable), intersected with IBP's — both are sound, so the intersection is, and it makes CROWN never
  looser than IBP on any neuron or margin.
- Input sets: the ℓ∞ ball ∩ the input box (a box, minimised exactly) or the ℓ2 ball (``a·x₀ − ε‖a‖₂``; the box is
  dropped, which only loosens the bound).
- The certificate bounds the **margins** ``z_y − z_j`` directly (the last layer is folded into the specification,
  as in both papers). The bounds hold for the network in exact arithmetic; the model itself runs in float32, whose
  logits can differ from the exact ones (issue 38: ≈ 3e-6 seen). So a point is certified at ε iff every margin's
  lower bound exceeds a **sound bound on the float32 rounding** of the two logits anywhere in the ball
  (:func:`rounding_bound`): with unit roundoff u = 2⁻²⁴ (2⁻¹¹ where CUDA runs the layer in TF32) and
  γ_k = k·u/(1 − k·u) (Higham, *Accuracy and Stability of Numerical Algorithms*, Lemma 3.1: a dot product of k terms
  in any order, FMA or not, errs by at most γ_k Σ|wᵢxᵢ|), an affine layer with k inputs per output turns an input
  error e into ``|W| e + γ_{k+1} (|W| (A + e) + |b|)`` (A: the largest |activation| IBP allows over the ball),
  BatchNorm's scale-and-shift into ``|s| e + γ_8 (|s| (A + e) + |μ s| + |β|)``, ReLU passes e unchanged. The float64
  arithmetic of the bounds themselves adds 2⁻⁵² to u. Certificates therefore never rest on a margin the model's
  own arithmetic can erase.

The network is first flattened into dense affine maps and ReLUs (a Conv2d becomes its matrix, read off by applying
it to the unit basis; BatchNorm in eval mode is a per-channel affine map; consecutive affine maps are multiplied
out). This is exact but costs memory (out × in per layer), so it is meant for the small nets of this project;
layers other than Linear, Conv2d, ReLU, Flatten, BatchNorm1d/2d, Dropout and Identity are refused, all named at once.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import torch
import torch.nn.functional as F
from torch import nn

from modelward.core.device import model_device
from modelward.core.zoo import MLP
from modelward.errors import ConfigError

BoundMethod = Literal["ibp", "crown"]
SUPPORTED = ("Linear", "Conv2d", "ReLU", "Flatten", "BatchNorm1d", "BatchNorm2d", "Dropout", "Identity",
             "Sequential")
MAX_ENTRIES = 64_000_000  # dense matrices above this size are refused (use a smaller net)


class UnsupportedLayerError(ConfigError):
    """The network has layers the bound propagation does not handle; the message lists every one."""


@dataclass
class Affine:
    weight: torch.Tensor  # out × in (float64)
    bias: torch.Tensor  # out


def _leaves(model: nn.Module, prefix: str = "") -> list[tuple[str, nn.Module]]:
    if isinstance(model, nn.Sequential):
        out = []
        for name, child in model.named_children():
            out += _leaves(child, f"{prefix}{name}.")
        return out
    return [(prefix.rstrip(".") or type(model).__name__, model)]


def as_sequential(model: nn.Module) -> nn.Module:
    """The project's zoo MLP (``modelward.core.zoo.MLP``: flatten, Linear+ReLU per hidden layer, logits) as the
    equivalent ``nn.Sequential`` sharing its layers; any other model is returned unchanged."""
    if type(model) is MLP:
        layers: list[nn.Module] = [nn.Flatten()]
        for i in range(1, model.n_hidden + 1):
            layers += [getattr(model, f"fc{i}"), nn.ReLU()]
        return nn.Sequential(*layers, model.logits)
    return model


def check_supported(model: nn.Module) -> None:
    """UnsupportedLayerError naming every layer that is not Linear/Conv2d/ReLU/Flatten/BatchNorm/Dropout/Identity."""
    if not isinstance(model, nn.Sequential):
        raise UnsupportedLayerError(f"bound propagation needs an nn.Sequential (of {', '.join(SUPPORTED[:-1])}), "
                                    f"got {type(model).__name__}")
    bad = [f"{name} ({type(m).__name__})" for name, m in _leaves(model) if type(m).__name__ not in SUPPORTED]
    if bad:
        raise UnsupportedLayerError(f"bound propagation does not support {len(bad)} layer(s): {', '.join(bad)}; "
                                    f"supported: {', '.join(SUPPORTED[:-1])}")


def _dense(layer: nn.Module, shape: tuple[int, ...]) -> tuple[Affine | None, tuple[int, ...]]:
    """The layer as an affine map on the flattened input of ``shape`` (None: identity), and its output shape."""
    d_in = 1
    for s in shape:
        d_in *= s
    if isinstance(layer, nn.Flatten | nn.Identity | nn.Dropout):
        return None, ((d_in,) if isinstance(layer, nn.Flatten) else shape)
    if isinstance(layer, nn.Linear):
        return Affine(layer.weight.detach().double(), _bias(layer.bias, layer.out_features, layer.weight.device)), (layer.out_features,)
    if isinstance(layer, nn.Conv2d):
        if layer.padding_mode != "zeros":
            raise UnsupportedLayerError(f"Conv2d with padding_mode={layer.padding_mode!r}: only 'zeros' is supported")
        basis = torch.eye(d_in, dtype=torch.float64, device=layer.weight.device).view(d_in, *shape)
        out = F.conv2d(basis, layer.weight.detach().double(), None, layer.stride, layer.padding, layer.dilation,
                       layer.groups)
        oshape = tuple(out.shape[1:])
        d_out = out[0].numel()
        if d_out * d_in > MAX_ENTRIES:
            raise ConfigError(f"Conv2d {shape} -> {oshape}: its dense matrix would have {d_out * d_in:,} entries "
                              f"(limit {MAX_ENTRIES:,}); bound propagation here is for small nets")
        bias = _bias(layer.bias, oshape[0], layer.weight.device).repeat_interleave(oshape[1] * oshape[2])
        return Affine(out.reshape(d_in, d_out).t().contiguous(), bias), oshape
    if isinstance(layer, nn.BatchNorm1d | nn.BatchNorm2d):
        if layer.running_mean is None or layer.running_var is None:
            raise UnsupportedLayerError("BatchNorm without running statistics (track_running_stats=False)")
        scale = (layer.weight.detach().double() if layer.weight is not None else 1.0) / torch.sqrt(
            layer.running_var.double() + layer.eps)
        shift = (layer.bias.detach().double() if layer.bias is not None else 0.0) - layer.running_mean.double() * scale
        per = d_in // scale.numel()
        return Affine(torch.diag(scale.repeat_interleave(per)), shift.repeat_interleave(per)), shape
    raise UnsupportedLayerError(f"unsupported layer {type(layer).__name__}")


def _bias(b: torch.Tensor | None, n: int, device: torch.device | None = None) -> torch.Tensor:
    return b.detach().double() if b is not None else torch.zeros(n, dtype=torch.float64, device=device)


def linearize(model: nn.Module, input_shape: tuple[int, ...]) -> list[Affine | str]:
    """The net as alternating dense affine maps and ``"relu"`` (consecutive affine maps multiplied out)."""
    check_supported(model)
    seq: list[Affine | str] = []
    shape = tuple(input_shape)
    for _, layer in _leaves(model):
        if isinstance(layer, nn.ReLU):
            seq.append("relu")
            continue
        aff, shape = _dense(layer, shape)
        if aff is None:
            continue
        if seq and isinstance(seq[-1], Affine):
            prev = seq[-1]
            seq[-1] = Affine(aff.weight @ prev.weight, aff.weight @ prev.bias + aff.bias)
        else:
            seq.append(aff)
    if not seq or not isinstance(seq[-1], Affine):
        raise UnsupportedLayerError("the net must end with an affine layer (Linear / Conv2d / BatchNorm)")
    if not isinstance(seq[0], Affine):
        dev = seq[-1].weight.device  # type: ignore[union-attr]
        seq.insert(0, Affine(torch.eye(_numel(input_shape), dtype=torch.float64, device=dev),
                             torch.zeros(_numel(input_shape), dtype=torch.float64, device=dev)))
    return seq


def _numel(shape: tuple[int, ...]) -> int:
    n = 1
    for s in shape:
        n *= s
    return n


class _InputSet:
    """The ℓ∞ ball ∩ box (a box) or the ℓ2 ball around one point; minimises ``Λ x`` in closed form."""

    def __init__(self, x: torch.Tensor, eps: float, norm: str, clip: tuple[float, float]) -> None:
        self.norm, self.eps, self.x = norm, eps, x
        if norm == "linf":
            lo, hi = (x - eps).clamp(min=clip[0]), (x + eps).clamp(max=clip[1])
            self.center, self.radius = (lo + hi) / 2, (hi - lo) / 2

    def min_linear(self, lam: torch.Tensor) -> torch.Tensor:
        """min over the set of ``lam @ x`` for every row of ``lam``."""
        if self.norm == "linf":
            return lam @ self.center - lam.abs() @ self.radius
        return lam @ self.x - self.eps * lam.norm(dim=1)


def _relax(lo: torch.Tensor, u: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """CROWN's lines per neuron: lower slope α, upper slope s and intercept t (a ≥ α h, a ≤ s h + t)."""
    active, dead = lo >= 0, u <= 0
    unstable = ~active & ~dead
    s = torch.where(active, torch.ones_like(lo), torch.zeros_like(lo))
    t = torch.zeros_like(lo)
    denom = (u - lo).clamp_min(1e-30)
    s = torch.where(unstable, u / denom, s)
    t = torch.where(unstable, -lo * u / denom, t)
    alpha = torch.where(active, torch.ones_like(lo), torch.zeros_like(lo))
    alpha = torch.where(unstable & (u >= -lo), torch.ones_like(lo), alpha)
    return alpha, s, t


def _backward_lower(spec: torch.Tensor, seq: list[Affine | str], k: int, bounds: list[tuple[torch.Tensor, ...]],
                    inp: _InputSet) -> torch.Tensor:
    """Lower bound of ``spec @ h_k`` (h_k: output of affine map k) by CROWN's backward pass."""
    lam = spec
    const = torch.zeros(spec.shape[0], dtype=torch.float64, device=spec.device)
    affines = [i for i, s in enumerate(seq) if isinstance(s, Affine)]
    pos = affines.index(k)
    for j in range(pos, -1, -1):
        aff = seq[affines[j]]
        assert isinstance(aff, Affine)
        const = const + lam @ aff.bias
        lam = lam @ aff.weight
        if j == 0:
            break
        alpha, s, t = bounds[j - 1]  # the ReLU after affine map j−1
        pos_part, neg_part = lam.clamp(min=0), lam.clamp(max=0)
        const = const + neg_part @ t
        lam = pos_part * alpha + neg_part * s
    return const + inp.min_linear(lam)


def _ibp(seq: list[Affine | str], inp: _InputSet, spec: torch.Tensor | None) -> list[tuple[torch.Tensor, ...]]:
    """IBP: (l, u) after every affine map (the last one through ``spec`` when given)."""
    out = []
    first = seq[0]
    assert isinstance(first, Affine)
    w = first.weight if spec is None or len(seq) > 1 else spec @ first.weight
    b = first.bias if spec is None or len(seq) > 1 else spec @ first.bias
    if inp.norm == "linf":
        c, r = w @ inp.center + b, w.abs() @ inp.radius
    else:
        c, r = w @ inp.x + b, inp.eps * w.norm(dim=1)
    out.append((c - r, c + r))
    for i in range(1, len(seq)):
        if seq[i] == "relu":
            continue
        aff = seq[i]
        assert isinstance(aff, Affine)
        lo, hi = out[-1]
        lo, hi = lo.clamp(min=0), hi.clamp(min=0)
        w, b = aff.weight, aff.bias
        if spec is not None and i == len(seq) - 1:
            w, b = spec @ w, spec @ b
        c, r = w @ ((lo + hi) / 2) + b, w.abs() @ ((hi - lo) / 2)
        out.append((c - r, c + r))
    return out


UNIT_ROUNDOFF_F32 = 2.0 ** -24
UNIT_ROUNDOFF_TF32 = 2.0 ** -11
UNIT_ROUNDOFF_F64 = 2.0 ** -53


def _gamma(k: torch.Tensor | float, u: float) -> torch.Tensor | float:
    return k * u / (1 - k * u)


def _unit_roundoff(layer: nn.Module) -> float:
    """The float32 unit roundoff of the layer's arithmetic (TF32 where CUDA allows it for this kind of layer), plus
    the float64 rounding of the bound computation itself."""
    u = UNIT_ROUNDOFF_F32
    if layer.weight.is_cuda:  # type: ignore[union-attr]
        tf32 = (torch.backends.cudnn.allow_tf32 if isinstance(layer, nn.Conv2d)
                else torch.backends.cuda.matmul.allow_tf32)
        u = UNIT_ROUNDOFF_TF32 if tf32 else u
    return u + 2 * UNIT_ROUNDOFF_F64


def rounding_layers(model: nn.Module, input_shape: tuple[int, ...]) -> list[tuple[nn.Module, Affine] | str]:
    """The net's layers as the float32 model runs them (not multiplied out): ``(layer, its dense map)`` or
    ``"relu"``; what :func:`rounding_bound` propagates errors through."""
    out: list[tuple[nn.Module, Affine] | str] = []
    shape = tuple(input_shape)
    for _, layer in _leaves(model):
        if isinstance(layer, nn.ReLU):
            out.append("relu")
            continue
        aff, shape = _dense(layer, shape)
        if aff is not None:
            out.append((layer, aff))
    return out


def rounding_bound(layers: list[tuple[nn.Module, Affine] | str], x: torch.Tensor, eps: float, norm: str,
                   clip: tuple[float, float] = (0.0, 1.0)) -> torch.Tensor:
    """A bound on ``|fl32(f(x')) − f(x')|`` per logit, valid for every x' in the input set around one flattened
    point ``x`` (float64): the error of the model's own float32 arithmetic (see the module docstring).

    Args:
        layers: :func:`rounding_layers` of the checked ``nn.Sequential``; x: one flattened point; eps, norm, clip:
            the input set.

    Returns:
        One bound per logit (float64).
    """
    inp = _InputSet(x, eps, norm, clip)
    lo = hi = err = None
    for item in layers:
        if item == "relu":
            assert lo is not None and hi is not None
            lo, hi = lo.clamp(min=0), hi.clamp(min=0)
            continue
        assert not isinstance(item, str)
        layer, aff = item
        w, b = aff.weight, aff.bias
        if lo is None:  # the first affine map reads the input set itself (float32 inputs: no error yet)
            if inp.norm == "linf":
                c, r = w @ inp.center + b, w.abs() @ inp.radius
                a_in = torch.maximum((inp.center - inp.radius).abs(), (inp.center + inp.radius).abs())
            else:
                c, r = w @ inp.x + b, inp.eps * w.norm(dim=1)
                a_in = inp.x.abs() + inp.eps
            e_in = torch.zeros_like(a_in)
        else:
            assert hi is not None and err is not None
            c, r = w @ ((lo + hi) / 2) + b, w.abs() @ ((hi - lo) / 2)
            a_in, e_in = torch.maximum(lo.abs(), hi.abs()), err
        u = _unit_roundoff(layer)
        if isinstance(layer, nn.BatchNorm1d | nn.BatchNorm2d):
            scale = w.diagonal()
            assert layer.running_mean is not None
            mean = layer.running_mean.double().repeat_interleave(len(scale) // layer.running_mean.numel())
            err = scale.abs() * e_in + _gamma(8, u) * (scale.abs() * (a_in + e_in) + (mean * scale).abs()
                                                       + (b + mean * scale).abs())
        else:
            k = (w != 0).sum(1).clamp(min=1).double() + 1  # the products of a row, plus the bias
            err = w.abs() @ e_in + _gamma(k, u) * (w.abs() @ (a_in + e_in) + b.abs())
        lo, hi = c - r, c + r
    assert err is not None
    return err


@dataclass(frozen=True)
class BoundCertificate:
    """Per point: the lower bounds of the margins ``z_y − z_j`` (n × classes, +inf at j = y), the float32
    rounding each margin must exceed (``rounding``, same shape, 0 at j = y) and certified."""

    method: str
    eps: float
    norm: str
    margin_lower: torch.Tensor
    certified: torch.Tensor
    rounding: torch.Tensor | None = None

    @property
    def certified_accuracy(self) -> float:
        return float(self.certified.float().mean()) if len(self.certified) else 0.0


def margin_spec(y: int, num_classes: int) -> torch.Tensor:
    """Rows ``e_y − e_j`` for every j ≠ y (num_classes − 1 rows)."""
    spec = -torch.eye(num_classes, dtype=torch.float64)
    spec[:, y] += 1
    return torch.cat([spec[:y], spec[y + 1:]])


def point_bounds(seq: list[Affine | str], x: torch.Tensor, eps: float, norm: str, method: BoundMethod,
                 spec: torch.Tensor, clip: tuple[float, float] = (0.0, 1.0)) -> torch.Tensor:
    """Lower bounds of ``spec @ f(x')`` over the input set around one flattened point ``x`` (float64)."""
    inp = _InputSet(x, eps, norm, clip)
    ibp = _ibp(seq, inp, spec)
    if method == "ibp":
        return ibp[-1][0]
    affines = [i for i, s in enumerate(seq) if isinstance(s, Affine)]
    relax: list[tuple[torch.Tensor, ...]] = []
    for j, k in enumerate(affines[:-1]):
        lo, hi = ibp[j]
        if j > 0:  # CROWN bounds for the neurons IBP leaves unstable, intersected with IBP's
            unstable = ((lo < 0) & (hi > 0)).nonzero().squeeze(1)
            if len(unstable):
                eye = torch.zeros(len(unstable), len(lo), dtype=torch.float64, device=lo.device)
                eye[torch.arange(len(unstable), device=lo.device), unstable] = 1.0
                cl = _backward_lower(eye, seq, k, relax, inp)
                cu = -_backward_lower(-eye, seq, k, relax, inp)
                lo, hi = lo.clone(), hi.clone()
                lo[unstable] = torch.maximum(lo[unstable], cl)
                hi[unstable] = torch.minimum(hi[unstable], cu)
        relax.append(_relax(lo, hi))
    crown = _backward_lower(spec, seq, affines[-1], relax, inp)
    return torch.maximum(crown, ibp[-1][0])


def _checked_sequential(model: nn.Module, x: torch.Tensor) -> nn.Module:
    """``as_sequential`` plus a check that the converted net computes the model's logits on ``x``."""
    seq = as_sequential(model)
    if seq is not model and len(x):
        with torch.no_grad():
            xb = x[:8].to(model_device(model))
            if not torch.allclose(seq(xb), model(xb), atol=1e-5, rtol=1e-5):
                raise UnsupportedLayerError(f"{type(model).__name__}: its sequential form disagrees with it")
    return seq


def certify_bounds(model: nn.Module, x: torch.Tensor, y: torch.Tensor, eps: float, norm: str = "linf",
                   method: BoundMethod = "crown", clip: tuple[float, float] = (0.0, 1.0)) -> BoundCertificate:
    """Certify every point by bound propagation: certified iff every margin ``z_y − z_j`` has a lower bound above the
    float32 rounding of its two logits over the ball (:func:`rounding_bound`; exact arithmetic alone is not enough).

    Args:
        model: an ``nn.Sequential`` of Linear / Conv2d / ReLU / Flatten / BatchNorm (eval) / Dropout / Identity
            (or the project's zoo MLP, converted by :func:`as_sequential`).
        x, y: the points (any input shape) and labels.
        eps: the radius.
        norm: ``"linf"`` (ball ∩ box) or ``"l2"`` (ball).
        method: ``"ibp"`` or ``"crown"``.
        clip: the input box (ℓ∞ only).

    Returns:
        A :class:`BoundCertificate` (margin lower bounds, certified mask, certified accuracy).

    Example:
        >>> import torch
        >>> from torch import nn
        >>> net = nn.Sequential(nn.Linear(2, 8), nn.ReLU(), nn.Linear(8, 3))
        >>> cert = certify_bounds(net, torch.rand(4, 2), torch.tensor([0, 1, 2, 0]), eps=0.0, method="ibp")
        >>> cert.margin_lower.shape
        torch.Size([4, 3])
    """
    if norm not in ("linf", "l2"):
        raise ConfigError(f"bounds: norm must be 'linf' or 'l2', got {norm!r}")
    if method not in ("ibp", "crown"):
        raise ConfigError(f"bounds: method must be 'ibp' or 'crown', got {method!r}")
    if eps < 0:
        raise ConfigError(f"bounds: eps must be >= 0, got {eps}")
    model = _checked_sequential(model, x)
    seq = linearize(model, tuple(x.shape[1:]))
    dev = model_device(model)
    num_classes = seq[-1].weight.shape[0]  # type: ignore[union-attr]
    xs = x.detach().to(dev).double().flatten(1)
    margins = torch.full((len(x), num_classes), float("inf"), dtype=torch.float64)
    rounding = torch.zeros((len(x), num_classes), dtype=torch.float64)
    layers = rounding_layers(model, tuple(x.shape[1:]))
    for i in range(len(x)):
        yi = int(y[i])
        low = point_bounds(seq, xs[i], float(eps), norm, method, margin_spec(yi, num_classes).to(dev), clip)
        others = [j for j in range(num_classes) if j != yi]
        margins[i, others] = low.cpu()
        err = rounding_bound(layers, xs[i], float(eps), norm, clip).cpu()
        rounding[i, others] = err[yi] + err[others]  # fl32(z_y) − fl32(z_j) ≥ (z_y − z_j) − e_y − e_j
    return BoundCertificate(method, float(eps), norm, margins, (margins > rounding).all(1), rounding)


def output_bounds(model: nn.Module, x: torch.Tensor, eps: float, norm: str = "linf", method: BoundMethod = "crown",
                  clip: tuple[float, float] = (0.0, 1.0)) -> tuple[torch.Tensor, torch.Tensor]:
    """Lower and upper bounds of every logit over the input set around each point (n × classes each)."""
    model = _checked_sequential(model, x)
    seq = linearize(model, tuple(x.shape[1:]))
    num_classes = seq[-1].weight.shape[0]  # type: ignore[union-attr]
    dev = seq[-1].weight.device  # type: ignore[union-attr]
    eye = torch.eye(num_classes, dtype=torch.float64, device=dev)
    xs = x.detach().to(dev).double().flatten(1)
    lows, ups = [], []
    for i in range(len(x)):
        lows.append(point_bounds(seq, xs[i], float(eps), norm, method, eye, clip))
        ups.append(-point_bounds(seq, xs[i], float(eps), norm, method, -eye, clip))
    return torch.stack(lows), torch.stack(ups)
