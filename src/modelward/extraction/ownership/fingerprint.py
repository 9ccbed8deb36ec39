"""Boundary fingerprints of a model (IPGuard: Cao, Jia & Gong, "IPGuard: Protecting Intellectual Property of Deep
Neural Networks via Fingerprinting the Classification Boundary", AsiaCCS 2021, §4), with a calibrated null.

A fingerprint is a set of inputs near the owner's classification boundary, each with the owner's top-1 label. A
model derived from the owner's weights (fine-tuned, pruned) keeps the boundary and agrees with those labels; an
independently trained model agrees far less often, because near a boundary small differences decide the class.

Construction (IPGuard §4.2, adapted): from random seed inputs (:func:`random_seeds`: uniform over the box the
owner's data spans — off the data manifold, where independently trained models extrapolate differently; seeds
taken from the data itself gave points that a lightly fine-tuned copy no longer agreed with), gradient steps on ``|z_{t1}(x') − z_{t2}(x') − κ|``
move each input toward the boundary between its top-2 classes ``t1``, ``t2`` of the owner's logits ``z`` (κ > 0
keeps it on the owner's side); the fingerprint label is the owner's top-1 there. Two disjoint sets of *reference*
models, trained independently on the same task, are used once each:

* **selection** — of the candidates, keep the ``n_points`` with which the selection references agree least
  (points an independent model tends to get "wrong" by the owner's standard);
* **calibration** — the agreement counts ``k_r`` of the calibration references on the kept points fix the null
  distribution of an innocent model's count: a beta-binomial BB(n, α, β) fitted by the method of moments, with
  its mean raised by two standard errors and its intra-model correlation floored at ``min_rho`` (few references
  under-estimate both). :func:`fingerprint_p_value` is its upper tail.

The p-value is thus a calibrated one (it assumes the suspect, if innocent, behaves like an independently trained
reference), not an exact one like the watermark's. What it proves is different too: *this model is (a
modification of) mine*, where the watermark proves *it learned from my answers*. A KnockoffNets copy trained on
the answers is not caught by it on digits (docs/guard.md has the measurement).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch
from scipy.stats import betabinom
from torch import Tensor, nn

from modelward.core.device import model_device
from modelward.core.modules import eval_mode
from modelward.errors import DataError

FORMAT = "modelward.fingerprint/1"


@dataclass
class Fingerprint:
    """The fingerprint inputs, the owner's labels there, and the null distribution of an innocent agreement count.

    Args:
        x: N × input-shape fingerprint inputs.
        labels: the owner's top-1 at ``x``.
        null_alpha, null_beta: the beta-binomial null BB(N, α, β) of an independent model's agreement count.
        reference_agreement: the calibration references' agreement rates (for the report).
        meta: how it was made (κ, steps, counts).

    Returns:
        ``p_value(agreements)``; ``save(path)`` / :meth:`load` (safetensors + JSON metadata; nothing pickled).
    """

    x: Tensor
    labels: Tensor
    null_alpha: float
    null_beta: float
    reference_agreement: list[float]
    meta: dict[str, float | int | str] = field(default_factory=dict)

    def __len__(self) -> int:
        return len(self.x)

    def p_value(self, agreements: int) -> float:
        """P[BB(N, α, β) ≥ agreements]: how often an innocent model agrees this often."""
        return fingerprint_p_value(agreements, len(self), self.null_alpha, self.null_beta)

    def save(self, path: Path) -> None:
        from safetensors.torch import save_file

        meta = {"format": FORMAT, "null_alpha": repr(self.null_alpha), "null_beta": repr(self.null_beta),
                "reference_agreement": json.dumps(self.reference_agreement), "meta": json.dumps(self.meta)}
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.name}.tmp")
        save_file({"x": self.x.contiguous().float(), "labels": self.labels.long()}, str(tmp), metadata=meta)
        tmp.replace(path)

    @classmethod
    def load(cls, path: Path) -> Fingerprint:
        from safetensors import safe_open

        path = Path(path)
        if not path.is_file():
            raise DataError(f"{path}: no fingerprint there (make one with `modelward guard fingerprint CONFIG`)")
        try:
            with safe_open(str(path), framework="pt") as fh:
                meta = fh.metadata() or {}
                if meta.get("format") != FORMAT:
                    raise DataError(f"{path}: not a modelward fingerprint (format {meta.get('format')!r})")
                x, labels = fh.get_tensor("x"), fh.get_tensor("labels")
            fp = cls(x, labels, float(meta["null_alpha"]), float(meta["null_beta"]),
                     [float(v) for v in json.loads(meta["reference_agreement"])], json.loads(meta["meta"]))
        except (KeyError, ValueError, OSError) as exc:
            raise DataError(f"{path}: damaged fingerprint file ({exc}); make it again") from exc
        if len(fp.x) != len(fp.labels) or not torch.isfinite(fp.x).all():
            raise DataError(f"{path}: damaged fingerprint file (inconsistent or non-finite tensors); make it again")
        return fp


def fingerprint_p_value(agreements: int, n: int, alpha: float, beta: float) -> float:
    """Upper tail P[BB(n, α, β) ≥ agreements] of the beta-binomial null.

    Example:
        >>> fingerprint_p_value(0, 50, 2.0, 8.0)
        1.0
        >>> fingerprint_p_value(50, 50, 2.0, 8.0) < 1e-6
        True
    """
    if n <= 0:
        return 1.0
    return float(min(1.0, betabinom.sf(agreements - 1, n, alpha, beta)))


def fit_null(counts: Sequence[int], n: int, min_rho: float = 0.02) -> tuple[float, float]:
    """Method-of-moments beta-binomial BB(n, α, β) for the agreement counts of independent references, made
    conservative: mean + 2 standard errors, intra-model correlation ρ ≥ ``min_rho``.

    Returns:
        (α, β).
    """
    if len(counts) < 2:
        raise DataError("fingerprint calibration needs at least 2 reference models")
    rates = np.asarray(counts, dtype=float) / n
    r = len(rates)
    m = float(np.clip(rates.mean() + 2.0 * rates.std(ddof=1) / np.sqrt(r), 1.0 / (n + 2), 1.0 - 1.0 / (n + 2)))
    v = float(rates.var(ddof=1))
    rho = (v * n / (m * (1 - m)) - 1.0) / max(n - 1, 1) if n > 1 else 1.0
    rho = float(np.clip(rho, min_rho, 0.99))
    s = 1.0 / rho - 1.0
    return m * s, (1.0 - m) * s


@torch.no_grad()
def _top1(model: nn.Module, x: Tensor, batch: int = 512) -> Tensor:
    dev = model_device(model)
    return torch.cat([model(x[i : i + batch].to(dev)).argmax(1).cpu() for i in range(0, len(x), batch)])


def random_seeds(x_data: Tensor, n: int, seed: int = 0) -> Tensor:
    """``n`` inputs uniform over the per-feature [min, max] box of ``x_data`` (seeded).

    Example:
        >>> import torch
        >>> random_seeds(torch.rand(10, 3), 5).shape
        torch.Size([5, 3])
    """
    if len(x_data) == 0:
        raise DataError("fingerprint: no data to take the input range from")
    lo, hi = x_data.min(0).values, x_data.max(0).values
    u = torch.rand((n, *x_data.shape[1:]), generator=torch.Generator().manual_seed(seed))
    return (lo + u * (hi - lo)).to(x_data.dtype)


def boundary_points(model: nn.Module, x: Tensor, *, kappa: float = 2.0, steps: int = 40, lr: float = 0.05,
                    clip: tuple[float, float] | None = (0.0, 1.0)) -> tuple[Tensor, Tensor]:
    """Move each input toward the boundary between the owner's top-2 classes (IPGuard §4.2).

    Args:
        model: the owner's classifier (logits), in eval mode.
        x: seed inputs.
        kappa: the logit margin to stop at, on the owner's side (> 0).
        steps, lr: Adam steps on the inputs.
        clip: the valid input range (None: unbounded).

    Returns:
        (points, the owner's top-1 at each point).
    """
    dev = model_device(model)
    with eval_mode(model, frozen_params=True):  # weights stay as they are; only the inputs move
        xp = x.detach().to(dev).clone().requires_grad_(True)
        with torch.no_grad():
            top2 = model(xp).topk(2, 1).indices
        t1, t2 = top2[:, :1], top2[:, 1:]
        opt = torch.optim.Adam([xp], lr=lr)
        for _ in range(steps):
            z = model(xp)
            loss = ((z.gather(1, t1) - z.gather(1, t2)).squeeze(1) - kappa).abs().sum()
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            if clip is not None:
                with torch.no_grad():
                    xp.clamp_(*clip)
        pts = xp.detach()
    return pts.cpu(), _top1(model, pts)


def make_fingerprint(model: nn.Module, x_seed: Tensor, selection_refs: Sequence[nn.Module],
                     calibration_refs: Sequence[nn.Module], *, n_points: int = 100, kappa: float = 2.0,
                     steps: int = 40, lr: float = 0.05, clip: tuple[float, float] | None = (0.0, 1.0),
                     min_rho: float = 0.02) -> Fingerprint:
    """Make a boundary fingerprint of ``model`` with a calibrated null (module docstring).

    Args:
        model: the owner's classifier.
        x_seed: seed inputs (:func:`random_seeds` of the owner's data); at least ``n_points``, a few times more
            to choose from.
        selection_refs: independently trained models that choose the points (≥ 1).
        calibration_refs: other independently trained models that calibrate the null (≥ 2; 8–10 recommended).
        n_points: fingerprint size (also the verification's query count).
        kappa, steps, lr, clip: :func:`boundary_points`.
        min_rho: the floor of the null's intra-model correlation.

    Returns:
        A :class:`Fingerprint`.

    Example:
        >>> import torch
        >>> torch.manual_seed(0) and None
        >>> mk = lambda: torch.nn.Sequential(torch.nn.Linear(4, 16), torch.nn.ReLU(), torch.nn.Linear(16, 3))
        >>> fp = make_fingerprint(mk(), random_seeds(torch.rand(40, 4), 40), [mk()], [mk(), mk()], n_points=10)
        >>> len(fp)
        10
    """
    if len(x_seed) < n_points:
        raise DataError(f"fingerprint: {len(x_seed)} seed inputs for n_points = {n_points}; give at least as many")
    if not selection_refs or len(calibration_refs) < 2:
        raise DataError("fingerprint: needs >= 1 selection reference and >= 2 calibration references "
                        "(independently trained models of the same task)")
    pts, labels = boundary_points(model, x_seed, kappa=kappa, steps=steps, lr=lr, clip=clip)
    agree = torch.stack([(_top1(r, pts) == labels) for r in selection_refs]).float().mean(0)
    # fewest selection agreements first; ties broken by order (deterministic)
    order = torch.argsort(agree + torch.arange(len(agree)) * 1e-9)[:n_points]
    x_fp, y_fp = pts[order], labels[order]
    counts = [int((_top1(r, x_fp) == y_fp).sum()) for r in calibration_refs]
    a, b = fit_null(counts, n_points, min_rho)
    return Fingerprint(x_fp, y_fp, a, b, [c / n_points for c in counts],
                       {"kappa": kappa, "steps": steps, "lr": lr, "candidates": len(x_seed),
                        "selection_refs": len(selection_refs), "calibration_refs": len(calibration_refs),
                        "min_rho": min_rho})
