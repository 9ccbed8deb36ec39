"""Internal influence χ(g∘h, q, 𝒟) = E_{x∼𝒟}[∇_z (q∘g)(h(x))] (seed 002 Def. 3.2, Eq. 3.1–3.2).

The three parameters of the explanation are objects:

- a :class:`Slice` ``f = g ∘ h`` cut at a module of any ``nn.Module`` (addressed by its module name, as the zoo's
  parts are: ``conv2``, ``fc1``, ``layer3.0``; ``None`` = the input), optionally with a second cut ``to_layer`` whose
  output the quantity of interest reads (the feature-localisation slice (h, h') of §3.3);
- a :class:`QuantityOfInterest` ``q`` (a class logit, a logit difference, the top logit, an internal unit or
  channel, any function of the output);
- a :class:`DistributionOfInterest` 𝒟 (a point, a straight-line path from a baseline with a chosen number of steps
  and quadrature rule, a Gaussian around the point, a fixed data set, or a mixture of those), given either over the
  input space or directly over the slice's latent space.

The estimator is Eq. 3.2: the DoI is a weighted sample set, and χ is the weighted mean of the gradients at the
slice, computed in batches of ``batch_size`` rows (one forward and one backward per batch, on the model's device).
Below an internal slice the forward pass runs without autograd book-keeping (only ``g`` needs a graph), which is
why this is cheaper than differentiating the whole network.

The three parameters live in :mod:`~modelward.explain.slices`, :mod:`~modelward.explain.quantities` and
:mod:`~modelward.explain.distributions`; this module holds the estimator and re-exports them.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager

import torch
from torch import nn

from modelward.core.modules import eval_mode, model_device
from modelward.core.slicing import (
    Cut,
    Interception,
    StopForward,
    intercept,
    resolve_module,
)
from modelward.errors import ConfigError
from modelward.explain.distributions import (  # re-exported: the explanation's parameters, in one namespace
    PATH_RULES,
    DatasetDoI,
    DistributionOfInterest,
    GaussianDoI,
    LinearDoI,
    MixtureDoI,
    PathRule,
    PointDoI,
    Space,
    _as_input_space,
    as_doi,
    path_alphas,
)
from modelward.explain.quantities import (
    ChannelQoI,
    ClassQoI,
    ComparativeQoI,
    LambdaQoI,
    MaxClassQoI,
    QuantityOfInterest,
    UnitQoI,
    as_qoi,
)
from modelward.explain.slices import Slice


# ------------------------------------------------------------------------------------------------------------
@contextmanager
def intercept_qoi(model: nn.Module, to_layer: str | None) -> Iterator[Interception]:
    """Record the (last) output of the QoI's module `to_layer`; nothing when the QoI reads the model output."""
    seen = Interception()
    if to_layer is None:
        yield seen
        return

    def at_qoi(_m: nn.Module, _i: object, out: torch.Tensor) -> None:
        seen.calls += 1
        seen.value = out

    def at_input(_m: nn.Module, args: tuple) -> None:
        seen.calls += 1
        seen.value = args[0]

    name, _, anchor = to_layer.partition(":")  # "fc:in": the module's input (see Slice)
    mod = resolve_module(model, name, "slice.to_layer")
    handle = mod.register_forward_pre_hook(at_input) if anchor == "in" else mod.register_forward_hook(at_qoi)
    try:
        yield seen
    finally:
        handle.remove()


class InternalInfluence:
    """χ(g∘h, q, 𝒟) of Def. 3.2, estimated by Eq. 3.2 in batches.

    Args:
        model: any ``nn.Module`` mapping a batch of inputs to outputs (put in eval mode while explaining).
        slice: where to cut (:class:`Slice`, a layer name, or ``None`` for the input).
        qoi: a :class:`QuantityOfInterest`, a class index, a ``(c1, c2)`` pair, ``"max"``, or a callable.
        doi: a :class:`DistributionOfInterest` (default: the point; ``"point"`` / ``"linear"`` also accepted).
        batch_size: most rows (DoI samples × inputs) per forward/backward pass (None = all at once); the
            default 4096 keeps activations cache- and memory-friendly without changing the result.

    Returns:
        :meth:`influence` gives E_𝒟[∇_z q∘g] with the shape of z (per explained input); :meth:`attribution` gives
        influence ⊙ (z − z_baseline) (§3.1's units of output; completeness along a path, Eq. 3.3).

    Example:
        >>> net = nn.Sequential()
        >>> net.add_module("fc1", nn.Linear(4, 8)); net.add_module("act", nn.ReLU())
        >>> net.add_module("logits", nn.Linear(8, 3))
        >>> ii = InternalInfluence(net, Slice("fc1"), ClassQoI(2), LinearDoI(steps=16))
        >>> tuple(ii.influence(torch.randn(5, 4)).shape)  # (B, 8) for the 8-unit fc1
        (5, 8)
    """

    def __init__(self, model: nn.Module, slice: Slice | str | None = None,
                 qoi: QuantityOfInterest | int | tuple[int, int] | str | Callable[..., torch.Tensor] = "max",
                 doi: DistributionOfInterest | str | None = None, batch_size: int | None = 4096) -> None:
        self.model = model
        self.slice = slice if isinstance(slice, Slice) else Slice(slice)
        self.slice.check(model)
        self.qoi = as_qoi(qoi)
        self.doi = as_doi(doi)
        if batch_size is not None and batch_size < 1:
            raise ConfigError(f"batch_size: must be >= 1, got {batch_size}")
        self.batch_size = batch_size
        if self.slice.from_layer is None and self.doi.space == "slice":
            # at the input slice the latent space *is* the input space
            self.doi = _as_input_space(self.doi)

    # -- activations --------------------------------------------------------------------------------------
    def _run(self, inp: torch.Tensor, replace: torch.Tensor | None, want_grad: bool
             ) -> tuple[torch.Tensor | None, torch.Tensor | None]:
        """One forward pass. Returns (z leaf, q-input y). With `replace`, the slice's output is replaced by it
        (a latent-space DoI); without `want_grad`, the pass stops at the slice and y is None."""
        model, sl = self.model, self.slice
        captured: dict[str, torch.Tensor] = {}
        if sl.from_layer is None:
            with intercept_qoi(model, sl.to_layer) as q:
                leaf = inp.detach().requires_grad_(want_grad)
                with torch.set_grad_enabled(want_grad):
                    y = model(leaf)
            return leaf, (y if sl.to_layer is None else q.check_called(Cut(sl.to_layer, field="slice.to_layer")))

        def at_slice(out: torch.Tensor) -> torch.Tensor:
            z = (replace if replace is not None else out).detach()
            if not want_grad:
                captured["z"] = z
                raise StopForward
            # only g needs a graph: autograd was off below the slice and is switched on here
            torch.set_grad_enabled(True)
            z = z.requires_grad_(True)
            captured["z"] = z
            return z.clone()  # a non-leaf, so in-place activations above the slice are allowed

        cut = sl.cut
        y: torch.Tensor | None
        with intercept_qoi(model, sl.to_layer) as q, intercept(model, cut, at_slice) as at:
            try:
                with torch.no_grad():
                    y = model(inp)
            except StopForward:
                y = None
        at.check_called(cut)
        if sl.to_layer is not None and y is not None:
            y = q.check_called(Cut(sl.to_layer, field="slice.to_layer"))
        return captured["z"], y

    @torch.no_grad()
    def activation(self, x: torch.Tensor) -> torch.Tensor:
        """z = h(x) for a batch of inputs (the input itself at the input slice)."""
        x = x.to(model_device(self.model))
        if self.slice.from_layer is None:
            return x
        with eval_mode(self.model):
            z, _ = self._run(x, None, want_grad=False)
        assert z is not None
        return z

    # -- the estimator ------------------------------------------------------------------------------------
    def _grad_mean(self, x: torch.Tensor) -> torch.Tensor:
        dev = model_device(self.model)
        x = x.to(dev)
        latent = self.doi.space == "slice" and self.slice.from_layer is not None
        if latent:
            pts, w = self.doi.sample(self.activation(x), self.baseline_activation(x))
        else:
            pts, w = self.doi.sample(x)
        n_s, n_b = pts.shape[0], pts.shape[1]
        flat = pts.reshape(n_s * n_b, *pts.shape[2:])
        rows = torch.arange(n_b, device=dev).repeat(n_s)
        row_w = w.repeat_interleave(n_b)
        step = self.batch_size or len(flat)
        acc: torch.Tensor | None = None
        with eval_mode(self.model):
            for i in range(0, len(flat), step):
                chunk, r = flat[i : i + step], rows[i : i + step]
                if latent:
                    # the model still needs inputs below the slice; their output is replaced by the samples
                    z, y = self._run(x[r] if x.shape[0] == n_b else x[:1].expand(len(r), *x.shape[1:]), chunk, True)
                else:
                    z, y = self._run(chunk, None, True)
                assert z is not None and y is not None
                q = self.qoi(y, r)
                g = torch.autograd.grad(q.sum(), z, allow_unused=True)[0] if q.requires_grad else None
                if g is None:
                    raise ConfigError("quantity of interest does not depend on the slice "
                                      "(is slice.to_layer below slice.from_layer?)")
                g = g * row_w[i : i + step].view(-1, *([1] * (g.dim() - 1)))
                if acc is None:
                    acc = torch.zeros((n_b, *g.shape[1:]), dtype=g.dtype, device=g.device)
                acc.index_add_(0, r, g)
        assert acc is not None
        return acc

    def influence(self, x: torch.Tensor) -> torch.Tensor:
        """χ: the DoI-weighted mean gradient of q∘g at the slice, one per explained input (Eq. 3.2)."""
        return self._grad_mean(x)

    def baseline_activation(self, x: torch.Tensor) -> torch.Tensor:
        """z at the DoI's baseline (h(baseline) for input-space baselines)."""
        x = x.to(model_device(self.model))
        doi = self.doi
        if isinstance(doi, LinearDoI) and doi.space == "slice" and doi.baseline_space == "slice":
            return doi.baseline(self.activation(x))
        return self.activation(doi.baseline(x))

    def attribution(self, x: torch.Tensor) -> torch.Tensor:
        """influence ⊙ (z − z_baseline) (§3.1 attribution; integrated gradients when 𝒟 is the straight path)."""
        infl = self._grad_mean(x)
        z = self.activation(x)
        return infl * (z - self.baseline_activation(x))

    def quantity(self, x: torch.Tensor) -> torch.Tensor:
        """q∘f at the points x (no gradient), e.g. for completeness checks: Σ attribution ≈ q(x) − q(baseline)."""
        x = x.to(model_device(self.model))
        with torch.no_grad(), eval_mode(self.model):
            if self.slice.to_layer is None:
                y = self.model(x)
            else:
                sl = Slice(None, self.slice.to_layer)
                _, y = InternalInfluence(self.model, sl, self.qoi)._run(x, None, want_grad=True)
                assert y is not None
                y = y.detach()
            return self.qoi(y, torch.arange(len(x), device=x.device))


def completeness_gap(ii: InternalInfluence, x: torch.Tensor) -> torch.Tensor:
    """Σ attribution − (q(x) − q(baseline)) per input (Eq. 3.3 efficiency); → 0 as the path resolution grows.

    Args:
        ii: an :class:`InternalInfluence` with a :class:`LinearDoI` (else ``ConfigError``).
        x: the explained inputs.

    Returns:
        The gap per input (B,).

    Example:
        >>> net = nn.Sequential()
        >>> net.add_module("fc1", nn.Linear(4, 8)); net.add_module("act", nn.ReLU())
        >>> net.add_module("logits", nn.Linear(8, 3))
        >>> ii = InternalInfluence(net, None, ClassQoI(0), LinearDoI(steps=64))
        >>> tuple(completeness_gap(ii, torch.randn(3, 4)).shape)  # small; → 0 with more steps
        (3,)
    """
    if not isinstance(ii.doi, LinearDoI):
        raise ConfigError("completeness is defined for a straight-line path DoI (LinearDoI)")
    attr = ii.attribution(x).flatten(1).sum(1)
    if ii.doi.space == "slice" and ii.slice.from_layer is not None:
        # q(baseline) must be evaluated with the slice's output set to z_baseline
        zb = ii.baseline_activation(x)
        with eval_mode(ii.model):
            _, y = ii._run(x.to(model_device(ii.model)), zb, True)
        assert y is not None
        qb = ii.qoi(y.detach(), torch.arange(len(x), device=zb.device))
    else:
        qb = ii.quantity(ii.doi.baseline(x.to(model_device(ii.model))))
    return attr - (ii.quantity(x) - qb)


__all__ = ["PATH_RULES", "ChannelQoI", "ClassQoI", "ComparativeQoI", "DatasetDoI", "DistributionOfInterest",
           "GaussianDoI", "InternalInfluence", "LambdaQoI", "LinearDoI", "MaxClassQoI", "MixtureDoI", "PathRule",
           "PointDoI", "QuantityOfInterest", "Slice", "Space", "UnitQoI", "as_doi", "as_qoi", "completeness_gap",
           "intercept_qoi", "path_alphas", "resolve_module"]
