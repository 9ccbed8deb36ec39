"""Bounded influence of a step: what one training step can change in a party, whatever its neighbour sends.

A neighbour chooses the tensors a party trains on (the activations ``h`` of the previous party, the gradients ``g``
of the next one). Refusing steps whose tensors look unusual is a threshold game: it refused honest steps and let
a patient attacker through (issue 36). This module bounds, instead, what any step can do, and never refuses:

1. **Per-row clipping** (the label holder). Row i's pull on the parameters is measured by the exact norm of its
   gradient on the last linear layer, ``r_i = ‖softmax(z_i) − e_{y_i}‖₂ · √(1 + ‖φ_i‖₂²)`` (``φ_i``: the row's
   input to that layer; the logit gradient alone where the part has no linear layer), and each row's loss is
   weighted by ``w_i = min(1, κ·C / r_i)``, so that no row weighs more than κ = ``row_multiple`` times the running
   ``row_quantile`` (the median) of the rows' norms. The training loss becomes ``(1/B) Σ w_i ℓ_i``: per-example
   clipping as in DP-SGD (Abadi et al., CCS 2016), with no noise, the clip norm following a quantile of the norms
   as in adaptive clipping (Andrew et al., NeurIPS 2021, eq. 2: ``C ← C · exp(−η (b̄ − γ))``, b̄ the fraction of
   rows at or below C). A few rows of the sender's choice then move the parameters no more than a few ordinary
   rows: late in training an honest row's norm is tiny, a row carrying another image's activation is not, and it is
   cut to κ·C. C can rise by at most ``exp(η γ)`` per step (2.5 % with the defaults) whatever the rows.
2. **A cap on the step** (every party). The gradient is scaled, never refused, to at most ``step_multiple`` times
   the running (geometric) average of the committed steps' gradient norms, before the optimizer step: this bounds
   the update whatever the per-row measure missed (the layers before the last one, a first party's incoming
   gradient). The average is of the capped norms, so it can rise by at most ``step_multiple ** (1 − step_decay)``
   per step (2.8 % with the defaults).
3. **Bounded running statistics** (a party that receives activations). A scaled activation barely moves a
   normalised loss but wrecks BatchNorm's running statistics (``h = 300·N(0, 1)`` took Bob from 0.98 to 0.10 in one
   step): each step may change a running variance by at most a factor ``1 + buffer_change`` and a running mean by
   at most ``buffer_change`` running standard deviations.

An honest step where no bound binds is computed exactly as without this module (bit for bit: the weighted loss is
used only when a row is clipped). The measured cost in accuracy and speed, and how often each bound binds on long
honest runs, are in docs/governance.md ("Integrity of a step"; ``bench/split_false_refusals.py``).

Example:
    >>> seg = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 3))
    >>> bi = BoundedInfluence(InfluenceConfig(), seg, label_holder=True, receives=True)
    >>> out = seg(torch.randn(16, 4)); root, per_row = bi.loss(out, torch.randint(0, 3, (16,)))
    >>> root.backward(); factor = bi.cap_step(list(seg.parameters())); per_row.shape
    torch.Size([16])
"""

from __future__ import annotations

import math
from typing import Any

import torch
import torch.nn.functional as F
from pydantic import Field
from torch import nn

from modelward.core.config import StrictModel


class InfluenceConfig(StrictModel):
    """``[integrity.influence]``: the bounds on one step (module docstring).

    Args:
        enabled: bound at all (default true; the exact harness of the tests turns it off to compare split and
            monolithic training bit for bit).
        row_quantile / row_multiple / row_rate: per-row clipping at ``row_multiple`` times the tracked
            ``row_quantile`` of the rows' norms, tracked with learning rate ``row_rate`` (η).
        step_multiple / step_decay: the cap on a step's gradient norm, as a multiple of the running geometric
            average (decay per step) of the committed steps' norms.
        buffer_change: the largest relative change of a BatchNorm running statistic per step.

    Example:
        >>> InfluenceConfig().row_multiple
        3.0
    """

    enabled: bool = True
    row_quantile: float = Field(0.5, gt=0.0, lt=1.0)
    row_multiple: float = Field(3.0, ge=1.0)
    row_rate: float = Field(0.05, gt=0.0, le=1.0)
    step_multiple: float = Field(4.0, gt=1.0)
    step_decay: float = Field(0.98, gt=0.0, lt=1.0)
    buffer_change: float = Field(0.1, gt=0.0)


_TINY = 1e-30


class BoundedInfluence:
    """The bounds of one party's steps (module docstring). One object per party; its state (the tracked clip norm,
    the running step norm, counters) goes into the party's checkpoints.

    Args:
        cfg: :class:`InfluenceConfig`.
        segment: the party's part (its last ``nn.Linear`` gives the rows' features; its BatchNorm layers are the
            running statistics bounded).
        label_holder: the party computes the loss (per-row clipping applies).
        receives: the party's input comes from a neighbour (its running statistics are bounded).
        warmup_steps: steps whose norms are recorded before the step cap binds.

    Returns:
        :meth:`loss` (the label holder's training loss, rows clipped), :meth:`cap_step` (before the optimizer
        step), :meth:`bound_buffers` (after it), :meth:`state` / :meth:`load_state`.

    Example:
        >>> bi = BoundedInfluence(InfluenceConfig(), torch.nn.Linear(3, 2), label_holder=False, receives=False)
        >>> bi.state()["step_norm_log"] is None
        True
    """

    def __init__(self, cfg: InfluenceConfig, segment: nn.Module, *, label_holder: bool, receives: bool,
                 warmup_steps: int = 20) -> None:
        self.cfg, self.label_holder, self.receives, self.warmup_steps = cfg, label_holder, receives, warmup_steps
        self.clip: float | None = None  # C, the tracked quantile of the rows' norms
        self.step_norm_log: float | None = None  # running average of log ‖gradient‖ (committed steps)
        self.steps = 0
        self.counts = {"rows": 0, "rows_clipped": 0, "steps_capped": 0, "buffers_bounded": 0}
        self._features: torch.Tensor | None = None
        self.clipped_rows = 0  # rows clipped in the last call of loss()
        linears = [m for m in segment.modules() if isinstance(m, nn.Linear)]
        if label_holder and linears:
            # the rows' inputs to the last linear layer (a reference, no copy): its per-row gradient norm is exact
            linears[-1].register_forward_hook(self._keep_features)
        self.norms = [(name, m) for name, m in segment.named_modules()
                      if isinstance(m, nn.modules.batchnorm._NormBase) and m.track_running_stats] if receives else []

    def _keep_features(self, module: nn.Module, inputs: tuple, output: torch.Tensor) -> None:
        # training forwards only, detached (the same storage): nothing of the graph or of an evaluation pass is
        # kept alive on the module, which stays copyable (copy.deepcopy)
        ok = module.training and inputs and torch.is_tensor(inputs[0])
        self._features = inputs[0].detach() if ok else None

    # ----------------------------------------------------------------- 1. per-row clipping (label holder)
    def row_norms(self, out: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        """``r_i``: the norm of row i's gradient on the last linear layer (module docstring), float32."""
        with torch.no_grad():
            p = out.detach().float().softmax(1)
            p[torch.arange(len(y)), y] -= 1.0
            r = p.norm(dim=1)
            f = self._features
            if f is not None and f.shape[0] == len(y):
                r = r * (1.0 + f.detach().float().flatten(1).pow(2).sum(1)).sqrt()
        return r

    def loss(self, out: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The label holder's training loss with every row's weight bounded, and the per-row losses (detached).

        Args:
            out: the logits of the batch (requiring grad).
            y: the labels.

        Returns:
            ``(loss to backpropagate, per-row cross-entropy)``: the loss is ``F.cross_entropy(out, y)`` itself when
            no row is clipped (or the bounds are off), ``(1/B) Σ w_i ℓ_i`` otherwise.
        """
        per_row = F.cross_entropy(out.detach(), y, reduction="none")
        self.clipped_rows = 0
        if not self.cfg.enabled or len(y) == 0:
            return F.cross_entropy(out, y), per_row
        r = self.row_norms(out, y)
        self._features = None  # (not kept past the step)
        finite = torch.isfinite(r)
        if self.clip is None:
            if not bool(finite.any()):
                return F.cross_entropy(out, y), per_row
            self.clip = max(float(torch.quantile(r[finite], self.cfg.row_quantile)), _TINY)
        limit = self.cfg.row_multiple * self.clip
        over = r > limit
        n_over = int(over.sum())
        # adaptive clipping (Andrew et al. 2021): the norm follows the row_quantile of the rows it sees, by at most
        # exp(row_rate * row_quantile) upwards per step; rows with a non-finite norm count as above it
        below = float(((r <= self.clip) & finite).float().mean())
        self.clip = max(self.clip * math.exp(-self.cfg.row_rate * (below - self.cfg.row_quantile)), _TINY)
        self.counts["rows"] += len(y)
        self.counts["rows_clipped"] += n_over
        self.clipped_rows = n_over
        if n_over == 0:
            return F.cross_entropy(out, y), per_row
        w = torch.where(over, limit / r.clamp_min(_TINY), torch.ones_like(r)).nan_to_num(0.0).to(out.dtype)
        return (F.cross_entropy(out, y, reduction="none") * w).sum() / len(y), per_row

    # ----------------------------------------------------------------- 2. the cap on the step
    def cap_step(self, params: list[torch.Tensor]) -> float:
        """Scale the gradients of `params` (in place, before the optimizer step) to at most ``step_multiple``
        times the running average norm, and record the (capped) norm. Returns the factor applied (1.0: none)."""
        if not self.cfg.enabled:
            return 1.0
        grads = [p.grad for p in params if p.grad is not None and p.grad.numel()]
        if not grads:
            return 1.0
        norm = float(torch.stack(torch._foreach_norm(grads)).norm())
        if not math.isfinite(norm) or norm <= 0.0:
            return 1.0  # (a non-finite update is the numeric check's: refused, nothing recorded)
        factor = 1.0
        if self.step_norm_log is not None and self.steps >= self.warmup_steps:
            cap = self.cfg.step_multiple * math.exp(self.step_norm_log)
            if norm > cap:
                factor = cap / norm
                torch._foreach_mul_(grads, factor)
                norm = cap
                self.counts["steps_capped"] += 1
        d = self.cfg.step_decay
        self.step_norm_log = math.log(norm) if self.step_norm_log is None else \
            d * self.step_norm_log + (1 - d) * math.log(norm)
        self.steps += 1
        return factor

    # ----------------------------------------------------------------- 3. running statistics
    def bound_buffers(self, before: dict[str, torch.Tensor], live: dict[str, torch.Tensor]) -> int:
        """Bound the change of every BatchNorm running statistic by this step (`before`: the values before it,
        `live`: the party's live buffers, changed in place where a bound binds). Returns how many were bounded."""
        if not self.cfg.enabled or not self.norms:
            return 0
        c, bounded = self.cfg.buffer_change, 0
        with torch.no_grad():  # (non-finite buffers never get here: the numeric check before this refuses them)
            for name, _ in self.norms:
                pre = f"{name}." if name else ""
                mk, vk = f"{pre}running_mean", f"{pre}running_var"
                if vk not in live or vk not in before:
                    continue
                v0, v = before[vk], live[vk]
                lo, hi = v0 / (1.0 + c), v0 * (1.0 + c)
                if bool(((v < lo) | (v > hi)).any()):
                    v.copy_(torch.minimum(torch.maximum(v, lo), hi))
                    bounded += 1
                if mk in live and mk in before:
                    m0, m = before[mk], live[mk]
                    reach = c * v0.clamp_min(0.0).sqrt()
                    if bool(((m - m0).abs() > reach).any()):
                        m.copy_(torch.minimum(torch.maximum(m, m0 - reach), m0 + reach))
                        bounded += 1
        self.counts["buffers_bounded"] += bounded
        return bounded

    # ----------------------------------------------------------------- state
    def state(self) -> dict[str, Any]:
        """Plain values for a checkpoint's metadata."""
        return {"clip": self.clip, "step_norm_log": self.step_norm_log, "steps": self.steps,
                "counts": dict(self.counts)}

    def load_state(self, state: dict[str, Any]) -> None:
        self.clip = None if state.get("clip") is None else float(state["clip"])
        self.step_norm_log = None if state.get("step_norm_log") is None else float(state["step_norm_log"])
        self.steps = int(state.get("steps", 0))
        self.counts.update({k: int(v) for k, v in dict(state.get("counts", {})).items() if k in self.counts})
