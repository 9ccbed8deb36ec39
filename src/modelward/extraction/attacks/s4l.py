"""S4L attack (Zhai et al.; seed 003 §4.1): add a self-supervised rotation loss while training the substitute,

  L = (1/|X_q|) Σ CE(f_s(x), ŷ) + w · (1/(4|X_r|)) Σ_x Σ_{j=0..3} CE(f_r(R_j(x)), j),

R_j rotates by j·90°, the rotation head f_r shares every layer of f_s except the last (a new Linear on the
features that feed the substitute's last Linear layer), w = 1.0 (official ``semitrainweight``). As in the code the
unlabeled rotation batches come from the whole transfer pool, drawn alongside the labelled batches.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from modelward.core.seed import seeded
from modelward.extraction.attacks.base import (
    AttackError,
    AttackStrategy,
    Context,
    EvalSet,
    fit_substitute,
)


def last_linear(model: nn.Module) -> nn.Linear:
    linears = [m for m in model.modules() if isinstance(m, nn.Linear)]
    if not linears:
        raise AttackError("s4l: the substitute has no nn.Linear output layer to share features with")
    return linears[-1]


class S4L(AttackStrategy):
    """Soft-label CE plus a 4-way rotation-prediction head on the shared features.

    Args:
        weight: weight of the rotation-prediction loss (images only).

    Returns:
        An attack strategy (how the substitute learns from the answers); combine it with a query strategy in
        :class:`ExtractionAttack` or by name with :func:`~modelward.extraction.attacks.make_extraction_attack`.

    Example:
        >>> from modelward.extraction.attacks import make_extraction_attack
        >>> attack = make_extraction_attack("knockoff", "s4l", strategy_params={"weight": 0.5})
        >>> attack.strategy.weight
        0.5
    """

    name = "s4l"

    def __init__(self, weight: float = 1.0) -> None:
        self.weight = weight

    def train(self, ctx: Context, model: nn.Module, x: torch.Tensor, targets: torch.Tensor,
              ev: EvalSet | None, seed: int) -> list[tuple[int, float, float]]:
        if x.dim() != 4 or x.shape[-1] != x.shape[-2]:
            raise AttackError(f"s4l: needs square images (N, C, H, H), got shape {tuple(x.shape)}")
        lin = last_linear(model)
        with seeded(seed):
            head = nn.Linear(lin.in_features, 4).to(lin.weight.device)
        feats: list[torch.Tensor] = []
        hook = lin.register_forward_pre_hook(lambda _m, inp: feats.append(inp[0]))
        pool = ctx.transfer.x

        def rotation_loss(m: nn.Module, xb: torch.Tensor, g: torch.Generator) -> torch.Tensor:
            idx = torch.randint(0, len(pool), (len(xb),), generator=g)
            xr = pool[idx].to(xb.device)
            rots = torch.cat([torch.rot90(xr, j, dims=(-2, -1)) for j in range(4)])
            lab = torch.arange(4, device=xb.device).repeat_interleave(len(xr))
            feats.clear()
            m(rots)
            return self.weight * F.cross_entropy(head(feats[-1]), lab)

        try:
            return fit_substitute(model, x, targets, ctx.cfg, seed, ev, rotation_loss, list(head.parameters()))
        finally:
            hook.remove()
