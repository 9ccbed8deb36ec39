"""Handling a trained model the same way in every area: eval mode that restores, its device, batched logits.

Every analysis (an attack, an explanation, a certificate, an evaluation) runs the model in eval mode and must hand
it back exactly as it found it: a user who froze a BatchNorm (``bn.eval()`` inside a training model) or froze some
parameters keeps them frozen. :func:`eval_mode` records *each* module's ``training`` flag (and, when asked, each
parameter's ``requires_grad``) and restores them in ``finally``, so an error inside the block loses nothing.
A flattening ``model.train(was)`` would instead switch every sub-module to ``was``.

Example:
    >>> import torch
    >>> from torch import nn
    >>> net = nn.Sequential(nn.Linear(4, 4), nn.BatchNorm1d(4)).train()
    >>> _ = net[1].eval()                      # a user's frozen BatchNorm
    >>> with eval_mode(net, frozen_params=True):
    ...     net.training, net[0].weight.requires_grad
    (False, False)
    >>> net.training, net[1].training, net[0].weight.requires_grad
    (True, False, True)
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import torch
from torch import nn

__all__ = ["batched_logits", "eval_mode", "model_device"]


@contextmanager
def eval_mode(model: nn.Module, frozen_params: bool = False) -> Iterator[nn.Module]:
    """Eval mode (and, with `frozen_params`, ``requires_grad=False`` on every parameter) for the block.

    Each module's ``training`` flag and each parameter's ``requires_grad`` are restored to what they were, one by
    one, in ``finally`` (also when the block raises).

    Args:
        model: the module; its sub-modules are switched too.
        frozen_params: also stop every parameter from requiring grad (attacks and inversions differentiate with
            respect to the input only, so no parameter gradient is accumulated).

    Returns:
        A context manager yielding `model`.

    Example:
        >>> with eval_mode(torch.nn.Dropout()) as m:
        ...     m.training
        False
    """
    modes = [(m, m.training) for m in model.modules()]
    flags = [(p, p.requires_grad) for p in model.parameters()] if frozen_params else []
    model.eval()
    try:
        for p, _ in flags:
            p.requires_grad_(False)
        yield model
    finally:
        for m, mode in modes:
            m.training = mode  # the attribute itself: an overridden ``train()`` would recurse and flatten
        for p, flag in flags:
            p.requires_grad_(flag)


def model_device(model: nn.Module) -> torch.device:
    """The device of a model's first parameter (or buffer); the CPU for a model with neither.

    Example:
        >>> model_device(torch.nn.Linear(2, 2))
        device(type='cpu')
    """
    for t in model.parameters():
        return t.device
    for t in model.buffers():
        return t.device
    return torch.device("cpu")


@torch.no_grad()
def batched_logits(model: nn.Module, x: torch.Tensor, batch_size: int = 1024) -> torch.Tensor:
    """Eval-mode outputs of `model` on `x`, in batches on the model's device, returned on the CPU.

    Args:
        model: the network (restored to its modes afterwards, see :func:`eval_mode`).
        x: the inputs (any device).
        batch_size: rows per forward pass.

    Returns:
        The concatenated outputs on the CPU (an empty tensor for empty `x`).

    Example:
        >>> batched_logits(torch.nn.Linear(3, 2), torch.zeros(5, 3), batch_size=2).shape
        torch.Size([5, 2])
    """
    if not len(x):
        return torch.zeros(0)
    dev = model_device(model)
    with eval_mode(model):
        return torch.cat([model(x[i:i + batch_size].to(dev)).cpu() for i in range(0, len(x), batch_size)])
