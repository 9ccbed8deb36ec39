"""The label holder's defence against label leakage: perturb the cut-layer gradient before returning it.

Bob (the label party) returns ``g_i = dL/dh_i`` for each example i of the batch. These gradients carry the labels
(see ``governance.leakage``): for softmax cross-entropy ``g_i = J_i^T (p_i - e_{y_i})``, so examples of one class
point the same way and the minority class has larger norms. Bob adds noise before sending:

- ``isotropic``: ``g_i + n_i`` with ``n_i ~ N(0, (P/d) I)``, the same for every class;
- ``marvell``: class-dependent Gaussian noise ``n_i ~ N(0, Σ_{y_i})`` optimised per batch as in Marvell (Li et al.
  2022, "Label Leakage and Protection in Two-party Split Learning", ICLR): minimise the sum over class pairs of
  the symmetrised KL divergence between the perturbed class-conditional gradient distributions (an upper bound on
  any attacker's detection advantage, via Pinsker) under the power budget ``Σ_c p_c E||n||² ≤ P``. As in the paper's
  closed form, each Σ_c is isotropic inside the span of the class-mean differences and isotropic outside it:
  ``Σ_c = a_c Π + b_c (I - Π)``. For two classes Π is the projector on ``ḡ_1 - ḡ_0`` and this is exactly Marvell's
  4-parameter problem; for K > 2 classes it is our direct generalisation (Π spans the K-1 mean differences, 2K
  parameters), not a result of the paper.

Both spend the same budget ``P = scale · S``, with S the mean squared distance between the batch's class-mean
gradients (``||ḡ_1 - ḡ_0||²`` for two classes; Marvell's power parameter s is ``scale``). ``scale = 0`` returns the
gradient unchanged. The noise comes from Bob's own randomness (``secrets``), unless a generator or a seed is given
(for reproducible measurements only: a seed another party knows lets it subtract the noise). Given the training
step and the examples' indices (the parties pass them), each example's noise is fixed by Bob's secret key, the step
and the index, so a step that is aborted and run again, which the two-phase protocol allows, returns the same noisy
gradient instead of a fresh sample to average.

Example:
    >>> cfg = LabelProtectionConfig(method="marvell", scale=4.0)
    >>> g_sent = protect_gradient(h.grad, y, cfg)  # doctest: +SKIP
"""

from __future__ import annotations

import hashlib
import hmac
import math
import secrets
from collections.abc import Mapping
from typing import Any, Literal

import numpy as np
import torch
from pydantic import Field

from modelward.core.config import StrictModel, validate
from modelward.errors import ConfigError, DataError, ModelwardError

Method = Literal["none", "isotropic", "marvell"]


class LabelProtectionConfig(StrictModel):
    """``[label_protection]``: how the label holder perturbs the gradient it returns to the previous party.

    ``method``: none | isotropic | marvell. ``scale``: noise power as a multiple of the batch's squared class-mean
    gradient distance (0 = off). ``seed``: only for reproducible experiments; leave unset in deployments.
    """

    method: Method = "none"
    scale: float = Field(1.0, ge=0.0, le=1e6)
    seed: int | None = None


def _flat(grad: torch.Tensor, labels: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    if grad.dim() < 1 or grad.shape[0] == 0:
        raise DataError(f"protect_gradient: grad must have a batch dimension, got shape {tuple(grad.shape)}")
    labels = torch.as_tensor(labels).reshape(-1)
    if labels.shape[0] != grad.shape[0]:
        raise DataError(f"protect_gradient: {labels.shape[0]} labels for a batch of {grad.shape[0]} gradients")
    return grad.detach().reshape(grad.shape[0], -1).double(), labels.to("cpu", torch.long)


def class_statistics(g: torch.Tensor, labels: torch.Tensor) -> dict:
    """Per-class means, weights and within-class per-dimension variances of flattened gradients (float64)."""
    classes = torch.unique(labels).tolist()
    n = g.shape[0]
    means, weights, within = [], [], []
    for c in classes:
        gc = g[labels.to(g.device) == c]
        mu = gc.mean(0)
        means.append(mu)
        weights.append(gc.shape[0] / n)
        within.append(float(((gc - mu) ** 2).sum() / (gc.shape[0] * g.shape[1])) if gc.shape[0] > 1 else 0.0)
    mu = torch.stack(means)
    if len(classes) > 1:
        d2 = torch.cdist(mu, mu) ** 2
        k = len(classes)
        signal = float(d2.sum() / (k * (k - 1)))
    else:  # one class in this batch: no mean difference to measure; use the mean squared norm instead
        signal = float((g ** 2).sum(1).mean())
        d2 = torch.zeros(1, 1, dtype=g.dtype, device=g.device)
    return {"classes": classes, "means": mu, "p": np.array(weights), "u": np.array(within), "signal": signal,
            "d2": d2.cpu().numpy()}


def marvell_variances(p: np.ndarray, u: np.ndarray, d2: np.ndarray, dim: int, rank: int,
                      power: float) -> tuple[np.ndarray, np.ndarray]:
    """Solve the Marvell power-allocation problem for per-class noise variances (in and out of the mean span).

    minimise Σ_{a<b} KL(N_a || N_b) + KL(N_b || N_a),  N_c = N(μ_c, (u_c + a_c) Π + (u_c + b_c)(I - Π)),
    subject to Σ_c p_c (rank · a_c + (dim - rank) · b_c) ≤ power,  a, b ≥ 0
    (the Marvell problem of Li et al. 2022; for two classes rank = 1).

    Args:
        p: class weights (fractions of the batch), shape [K].
        u: within-class gradient variance per dimension, shape [K].
        d2: squared distances between class means, shape [K, K].
        dim: gradient dimension d.
        rank: dimension of the span of the class-mean differences (1 for two classes).
        power: the budget P.
    Returns:
        ``(a, b)``: per-class noise variances per dimension inside and outside the span.
    """
    from scipy.optimize import minimize

    k = len(p)
    out = dim - rank
    s = power if power > 0 else 1.0
    uu = u / s + 1e-9  # work in units of the budget; the epsilon keeps noiseless classes finite
    dd = d2 / s

    def unpack(z: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        a = z[:k] / rank  # z = fraction of the budget each class spends inside / outside the span
        b = z[k:] / out if out > 0 else np.zeros(k)
        return a, b

    iu = np.triu_indices(k, 1)

    def objective(z: np.ndarray) -> float:
        a, b = unpack(z)
        va, vb = uu + a, uu + b
        r = va[:, None] / va[None, :]
        t = vb[:, None] / vb[None, :]
        sym = rank * (r + 1 / r) + out * (t + 1 / t) + dd * (1 / va[:, None] + 1 / va[None, :]) - 2 * dim
        return float(0.5 * sym[iu].sum())

    def gradient(z: np.ndarray) -> np.ndarray:
        # d/dva_c of the pair sum: 0.5 Σ_b [rank (1/va_b - va_b/va_c²) - D_cb/va_c²] (the b = c term is 0)
        a, b = unpack(z)
        va, vb = uu + a, uu + b
        ga = 0.5 * (rank * (1 / va[None, :] - va[None, :] / va[:, None] ** 2) - dd / va[:, None] ** 2).sum(1)
        gb = 0.5 * (out * (1 / vb[None, :] - vb[None, :] / vb[:, None] ** 2)).sum(1)
        return np.concatenate([ga / rank, gb / out]) if out > 0 else ga / rank

    n_var = 2 * k if out > 0 else k
    z0 = np.concatenate([np.ones(k), np.zeros(k)])[:n_var] if out > 0 else np.ones(k)
    bounds = [(0.0, 1.0 / max(pc, 1e-9)) for pc in p] * (2 if out > 0 else 1)
    pp = np.concatenate([p, p]) if out > 0 else p

    def full(z: np.ndarray) -> np.ndarray:
        return z if out > 0 else np.concatenate([z, np.zeros(k)])

    res = minimize(lambda z: objective(full(z)), z0, jac=lambda z: gradient(full(z)), method="SLSQP", bounds=bounds,
                   constraints=[{"type": "ineq", "fun": lambda z: 1.0 - float(pp @ z), "jac": lambda z: -pp}],
                   options={"maxiter": 200, "ftol": 1e-10})
    z = full(np.clip(res.x, 0.0, None))
    spent = float(pp @ (z if out > 0 else z[:k]))
    if spent > 1.0:  # SLSQP may overshoot the constraint slightly
        z = z / spent
    if not np.isfinite(z).all() or objective(z) > objective(full(z0)) + 1e-9:
        z = full(z0)  # never worse than spending the budget evenly inside the span
    a, b = unpack(z)
    return a * s, b * s


def _generator(config: LabelProtectionConfig, generator: torch.Generator | None, device: torch.device
               ) -> torch.Generator:
    if generator is not None:
        return generator
    seed = config.seed if config.seed is not None else secrets.randbits(63)
    return torch.Generator(device=device).manual_seed(seed)


_PROCESS_KEY: bytes | None = None


def _noise_key(config: LabelProtectionConfig) -> bytes:
    """Bob's secret for keyed noise: random per process, or derived from ``seed`` (experiments only)."""
    global _PROCESS_KEY
    if config.seed is not None:
        return hashlib.sha256(f"modelward-label-protection:{config.seed}".encode()).digest()
    if _PROCESS_KEY is None:
        _PROCESS_KEY = secrets.token_bytes(32)
    return _PROCESS_KEY


def keyed_normal(key: bytes, step: int, index: torch.Tensor, dim: int, device: torch.device) -> torch.Tensor:
    """Standard normal rows, one per example, fixed by (key, step, example index): a retried step gets the same.

    Without this, a driver that aborts step s after seeing Bob's gradient and runs s again (the two-phase protocol
    restores Bob bit for bit, so his clean gradient is identical) would receive the same gradient under fresh noise
    each time, and averaging K retries divides the noise power by K.
    """
    rows = []
    for i in index.reshape(-1).tolist():
        digest = hmac.new(key, f"{int(step)}:{int(i)}".encode(), hashlib.sha256).digest()
        gen = torch.Generator(device="cpu").manual_seed(int.from_bytes(digest[:8], "little") >> 1)
        rows.append(torch.randn(dim, generator=gen, dtype=torch.float64))
    return torch.stack(rows).to(device)


def as_protection_config(config: LabelProtectionConfig | Mapping[str, Any] | None) -> LabelProtectionConfig:
    """A ``[label_protection]`` table (dict) or None as a validated config (ConfigError naming the bad field)."""
    if isinstance(config, LabelProtectionConfig):
        return config
    if config is None:
        return LabelProtectionConfig()
    if not isinstance(config, Mapping):
        raise ConfigError(f"label_protection: expected a table (method, scale, seed), got {type(config).__name__}")
    return validate(LabelProtectionConfig, dict(config), "label_protection")


def protect_gradient(grad: torch.Tensor, labels: torch.Tensor,
                     config: LabelProtectionConfig | Mapping[str, Any] | None, *,
                     generator: torch.Generator | None = None, step: int | None = None,
                     index: torch.Tensor | None = None) -> torch.Tensor:
    """Return the gradient Bob sends back, perturbed to hide the labels (see the module docstring).

    Args:
        grad: ``dL/dh`` for the batch, shape ``[B, ...]`` (any trailing shape, any float dtype / device).
        labels: the batch's integer labels, shape ``[B]``.
        config: method and scale (``LabelProtectionConfig``, or the ``[label_protection]`` table as a dict).
        generator: optional torch.Generator for the noise (experiments); default: fresh secret randomness.
        step, index: the training step and the examples' indices in the training set. When both are given (and no
            `generator`), each example's noise is fixed by Bob's secret key, the step and its index
            (:func:`keyed_normal`), so repeating a step after an abort reveals nothing new. Parties pass them.
    Returns:
        A tensor of the same shape, dtype and device as `grad` (`grad` itself when method is none or scale 0).
    Example:
        >>> protect_gradient(g, y, LabelProtectionConfig(method="isotropic", scale=1.0))  # doctest: +SKIP
    """
    config = as_protection_config(config)
    if config.method == "none" or config.scale == 0.0:
        return grad
    g, y = _flat(grad, labels)
    bsz, dim = g.shape
    st = class_statistics(g, y)
    power = config.scale * st["signal"]
    if step is not None and index is not None and generator is None:
        if torch.as_tensor(index).numel() != bsz:
            raise DataError(f"protect_gradient: {torch.as_tensor(index).numel()} indices for a batch of {bsz}")
        z = keyed_normal(_noise_key(config), step, torch.as_tensor(index), dim, g.device)
    else:
        gen = _generator(config, generator, g.device)
        z = torch.randn(g.shape, generator=gen, dtype=torch.float64, device=g.device)
    if config.method == "isotropic" or len(st["classes"]) < 2:
        noise = z * math.sqrt(power / dim)
    else:
        centred = st["means"] - st["means"].mean(0, keepdim=True)
        _, sv, vh = torch.linalg.svd(centred, full_matrices=False)
        keep = sv > sv.max() * 1e-9
        q = vh[keep].T  # d × m orthonormal basis of the span of the class-mean differences
        m = q.shape[1]
        a, b = marvell_variances(st["p"], st["u"], st["d2"], dim, m, power)
        index = {c: i for i, c in enumerate(st["classes"])}
        rows = torch.tensor([index[int(c)] for c in y.tolist()], device=g.device)
        sa = torch.as_tensor(np.sqrt(a), device=g.device)[rows][:, None]
        sb = torch.as_tensor(np.sqrt(b), device=g.device)[rows][:, None]
        # n = sqrt(b) z + (sqrt(a) - sqrt(b)) Π z  has covariance a Π + b (I - Π)
        noise = sb * z + (sa - sb) * ((z @ q) @ q.T)
    return (g + noise).to(grad.dtype).reshape(grad.shape)


class ProtectReply:
    """The label holder's protection as a step on its outgoing reply (Flower's ``LocalDpMod``: run the operation,
    then perturb what leaves): after a training step, the gradient ``g`` returned to the previous party is
    replaced by :func:`protect_gradient` of it, with the labels of the batch's indices. The party's own loss and
    update are untouched; only what travels is perturbed.

    Args:
        config: the ``[label_protection]`` table.
        labels: the label holder's training labels (indexed by the batch's ``idx``).
        in_shape: the shape (no batch) of the gradient it returns, to check the table at start-up.
        who: the party's name, for errors.

    Example:
        >>> protect = ProtectReply(LabelProtectionConfig(method="marvell", scale=4.0), y_train, (4, 4, 4), "bob")
        >>> reply = protect(msg, "alice", party_step)  # doctest: +SKIP
    """

    def __init__(self, config: LabelProtectionConfig, labels: torch.Tensor, in_shape: tuple[int, ...],
                 who: str) -> None:
        self.config, self.labels = config, labels
        try:  # a bad table fails at start-up, not at the first step
            g = torch.randn(8, *in_shape, generator=torch.Generator().manual_seed(0))
            protect_gradient(g, torch.arange(8) % 2, config)
        except ModelwardError as e:
            raise ConfigError(f"party {who}: [label_protection]: {e}") from None

    def gradient(self, g: torch.Tensor, idx: torch.Tensor, step: int) -> torch.Tensor:
        """The gradient `g` of the batch `idx` at training step `step`, perturbed (what leaves; the party's release
        path calls this for every gradient it returns)."""
        return protect_gradient(g, self.labels[idx], self.config, step=step, index=idx)

    def __call__(self, msg: Any, caller: str, call_next: Any) -> Any:
        """``call_next(msg, caller)`` (the step), then its reply's gradient ``g`` perturbed."""
        reply = call_next(msg, caller)
        g = reply.tensors.get("g")
        if g is not None:
            reply.tensors["g"] = self.gradient(g, msg.tensors["idx"], msg.step)
        return reply


def reply_protection(config: LabelProtectionConfig | None, explicit: bool, labels: torch.Tensor | None,
                     in_shape: tuple[int, ...], who: str, is_last: bool) -> ProtectReply | None:
    """A party's reply-side gradient protection (``[label_protection]``), checked at start-up: the label
    holder's only. On by default (Marvell, scale 4); ``method = "none"`` (or ``scale = 0``) opts out.

    Args:
        config: the party's ``[label_protection]`` table (None: none).
        explicit: the party's configuration sets the table itself (not the default).
        labels: the party's training labels (None unless it is the label holder).
        in_shape: the shape (no batch) of the gradient it returns.
        who: the party's name, for errors.
        is_last: the party is the label holder (the last party).

    Returns:
        The protection to wrap the party's step with, or None (not the label holder, or opted out).

    Example:
        >>> reply_protection(LabelProtectionConfig(method="none"), True, None, (4,), "alice", False) is None
        True
    """
    if config is None:
        return None
    if not is_last:
        if explicit and config.method != "none":
            raise ConfigError(f"party {who}: [label_protection] is for the label holder (the last party)")
        return None
    if config.method == "none" or config.scale == 0:
        return None
    return ProtectReply(config, labels, in_shape, who)
