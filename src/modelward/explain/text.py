"""Token attributions of a text classifier: integrated gradients at the token embedding layer.

Integrated gradients (Sundararajan et al. 2017, Eq. 3) need a path of inputs; token ids have none, so the path runs
through the word embeddings, as Captum's ``LayerIntegratedGradients`` on the embedding layer does:
``e(α) = e_base + α (e_x − e_base)`` with the baseline text = the same text with every real token replaced by the
padding token's embedding (special tokens such as [CLS] and [SEP] kept, as in Captum's BERT tutorial). The
attribution of token i is ``(e_x,i − e_base,i) · mean_α ∇_{e_i} f_c(e(α))`` (a Riemann midpoint sum over
``steps``); the attributions of a text sum to about ``f_c(x) − f_c(baseline)`` (completeness), where the baseline
is the end of the path: padding embeddings at the real tokens' positions, the attention mask unchanged (so it is
not the model's output on an all-padding text, whose positions the mask would hide). Agrees with Captum's
``LayerIntegratedGradients(..., method="riemann_middle")`` on the word embeddings (tests/explain/test_text.py).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import nn

from modelward.core.modules import eval_mode
from modelward.core.text import embedding_delta, token_embedding


def token_attributions(model: nn.Module, ids: torch.Tensor, target: int | torch.Tensor,
                       special_ids: Sequence[int] = (), pad_id: int = 0, steps: int = 32) -> torch.Tensor:
    """Integrated gradients of the class logit `target` for every token of `ids` (N × L), at the embedding layer.

    Args:
        model: a text classifier (token ids -> logits) with a token ``nn.Embedding``.
        ids: token ids, right-padded with `pad_id`.
        target: the class (one for all rows, or one per row).
        special_ids: tokens kept in the baseline (padding, [CLS], [SEP], ...); their attribution is 0.
        pad_id: the padding token, whose embedding replaces every real token in the baseline.
        steps: points of the Riemann midpoint sum.

    Returns:
        N × L attributions (0 at special and padding positions).

    Example:
        >>> emb = nn.Embedding(10, 3); net = nn.Sequential(emb, nn.Flatten(), nn.Linear(12, 2))
        >>> a = token_attributions(net, torch.tensor([[4, 5, 6, 0]]), 1, special_ids=(0,))
        >>> a.shape, float(a[0, 3])
        (torch.Size([1, 4]), 0.0)
    """
    table = token_embedding(model).weight.detach()
    keep = torch.zeros_like(ids, dtype=torch.bool)
    for s in {*special_ids, pad_id}:
        keep |= ids == s
    base_ids = torch.where(keep, ids, torch.full_like(ids, pad_id))
    diff = table[ids] - table[base_ids]  # N × L × D, zero where kept
    tgt = torch.as_tensor(target, device=ids.device).expand(len(ids)) if not torch.is_tensor(target) or \
        target.dim() == 0 else target.to(ids.device)
    total = torch.zeros_like(diff)
    with eval_mode(model, frozen_params=True):
        for k in range(steps):
            alpha = (k + 0.5) / steps
            # E[ids] + delta = e_base + alpha (e_x − e_base)
            delta = ((alpha - 1.0) * diff).requires_grad_(True)
            with torch.enable_grad(), embedding_delta(model, delta):
                out = model(ids).gather(1, tgt.view(-1, 1)).sum()
                (g,) = torch.autograd.grad(out, delta)
            total += g
    return (diff * total / steps).sum(-1).masked_fill(keep, 0.0)
