"""Quantities of interest q (seed 002 §3.2): output (or a layer's output) → one number per row."""

from __future__ import annotations

import inspect
from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch

from modelward.errors import ConfigError


class QuantityOfInterest(ABC):
    """q: output (or a layer's output) → one number per row (§3.2). ``rows`` holds, for each row of ``y``, the
    index of the explained input it belongs to (so per-input targets work on the batched DoI samples).

    Args:
        (subclasses) their own parameters; calling takes ``y`` (outputs, one row per sample) and ``rows``.

    Returns:
        Calling it returns a tensor (N,): one number per row of ``y``.

    Example:
        >>> q = ClassQoI(1)
        >>> isinstance(q, QuantityOfInterest), q(torch.tensor([[0.0, 2.0]]), torch.tensor([0])).tolist()
        (True, [2.0])
    """

    @abstractmethod
    def __call__(self, y: torch.Tensor, rows: torch.Tensor) -> torch.Tensor: ...


def _per_row(c: int | Sequence[int] | torch.Tensor, rows: torch.Tensor) -> torch.Tensor | int:
    if isinstance(c, int):
        return c
    t = torch.as_tensor(c, dtype=torch.long, device=rows.device)
    return t[rows]


def _pick(y: torch.Tensor, c: torch.Tensor | int) -> torch.Tensor:
    y = y.flatten(1)
    if isinstance(c, int):
        if not -y.shape[1] <= c < y.shape[1]:
            raise ConfigError(f"quantity of interest: class/unit {c} out of range; the output has {y.shape[1]} units")
        return y[:, c]
    if int(c.max()) >= y.shape[1] or int(c.min()) < 0:
        raise ConfigError(f"quantity of interest: class/unit out of range; the output has {y.shape[1]} units")
    return y.gather(1, c[:, None])[:, 0]


@dataclass(frozen=True)
class ClassQoI(QuantityOfInterest):
    """q(y) = y_c: the logit of class ``c`` (one class, or one class per explained input).

    Args:
        c: a class index, or a tuple of one class per explained input.

    Returns:
        Calling ``q(y, rows)`` returns y_c per row (``ConfigError`` if ``c`` is out of range).

    Example:
        >>> ClassQoI((0, 1))(torch.tensor([[1.0, 2.0], [3.0, 4.0]]), torch.tensor([0, 1])).tolist()
        [1.0, 4.0]
    """

    c: int | tuple[int, ...]

    def __call__(self, y: torch.Tensor, rows: torch.Tensor) -> torch.Tensor:
        return _pick(y, _per_row(self.c, rows))


@dataclass(frozen=True)
class ComparativeQoI(QuantityOfInterest):
    """q(y) = y_{c1} − y_{c2}: "why c1 rather than c2" (§3.2).

    Args:
        c1 / c2: the two classes (an index, or one per explained input).

    Returns:
        Calling ``q(y, rows)`` returns y_{c1} − y_{c2} per row.

    Example:
        >>> ComparativeQoI(1, 0)(torch.tensor([[1.0, 3.0]]), torch.tensor([0])).tolist()
        [2.0]
    """

    c1: int | tuple[int, ...]
    c2: int | tuple[int, ...]

    def __call__(self, y: torch.Tensor, rows: torch.Tensor) -> torch.Tensor:
        return _pick(y, _per_row(self.c1, rows)) - _pick(y, _per_row(self.c2, rows))


@dataclass(frozen=True)
class MaxClassQoI(QuantityOfInterest):
    """q(y) = max_i y_i (the predicted class's logit at each sample).

    Args:
        (none)

    Returns:
        Calling ``q(y, rows)`` returns the largest output per row.

    Example:
        >>> MaxClassQoI()(torch.tensor([[1.0, 3.0], [5.0, 0.0]]), torch.tensor([0, 1])).tolist()
        [3.0, 5.0]
    """

    def __call__(self, y: torch.Tensor, rows: torch.Tensor) -> torch.Tensor:
        return y.flatten(1).max(1).values


@dataclass(frozen=True)
class UnitQoI(QuantityOfInterest):
    """q(z) = z_i: one internal unit (flat index into the layer output), for feature localisation (§3.3).

    Args:
        unit: the flat index into the layer's output.

    Returns:
        Calling ``q(z, rows)`` returns z_unit per row.

    Example:
        >>> UnitQoI(2)(torch.tensor([[1.0, 2.0, 7.0]]), torch.tensor([0])).tolist()
        [7.0]
    """

    unit: int

    def __call__(self, y: torch.Tensor, rows: torch.Tensor) -> torch.Tensor:
        return _pick(y, self.unit)


@dataclass(frozen=True)
class ChannelQoI(QuantityOfInterest):
    """q(z) = Σ_{spatial} z_{c,·,·}: one channel of a convolutional layer (TruLens' internal-channel QoI).

    Args:
        channel: the channel index (``ConfigError`` if out of range).

    Returns:
        Calling ``q(z, rows)`` returns the channel's spatial sum per row.

    Example:
        >>> ChannelQoI(1)(torch.ones(2, 3, 4, 4), torch.tensor([0, 1])).tolist()
        [16.0, 16.0]
    """

    channel: int

    def __call__(self, y: torch.Tensor, rows: torch.Tensor) -> torch.Tensor:
        if y.dim() < 2 or not 0 <= self.channel < y.shape[1]:
            raise ConfigError(f"quantity of interest: channel {self.channel} out of range for output {tuple(y.shape)}")
        return y[:, self.channel].reshape(len(y), -1).sum(1)


class LambdaQoI(QuantityOfInterest):
    """Any user function of the output: ``fn(y) -> (N,)`` or ``fn(y, rows) -> (N,)``.

    Args:
        fn: the function (one or two parameters); it must return one value per row (else ``ConfigError``).

    Returns:
        Calling ``q(y, rows)`` returns ``fn``'s values.

    Example:
        >>> LambdaQoI(lambda y: y.sum(1))(torch.tensor([[1.0, 2.0]]), torch.tensor([0])).tolist()
        [3.0]
    """

    def __init__(self, fn: Callable[..., torch.Tensor]) -> None:
        self.fn = fn
        try:
            self._two = len(inspect.signature(fn).parameters) >= 2
        except (TypeError, ValueError):
            self._two = False

    def __call__(self, y: torch.Tensor, rows: torch.Tensor) -> torch.Tensor:
        out = self.fn(y, rows) if self._two else self.fn(y)
        if out.dim() != 1 or out.shape[0] != y.shape[0]:
            raise ConfigError(f"quantity of interest: the function must return one value per row, got {tuple(out.shape)}")
        return out


def as_qoi(q: QuantityOfInterest | int | tuple[int, int] | str | Callable[..., torch.Tensor]) -> QuantityOfInterest:
    """Shorthands (as in TruLens): int → class logit, (c1, c2) → comparative, "max" → top logit, callable →
    :class:`LambdaQoI`."""
    if isinstance(q, QuantityOfInterest):
        return q
    if isinstance(q, bool):
        raise ConfigError("qoi: a boolean is not a quantity of interest; use a class index, (c1, c2), 'max'")
    if isinstance(q, int):
        return ClassQoI(q)
    if isinstance(q, tuple) and len(q) == 2 and all(isinstance(c, int) for c in q):
        return ComparativeQoI(q[0], q[1])
    if q == "max":
        return MaxClassQoI()
    if callable(q):
        return LambdaQoI(q)
    raise ConfigError(f"qoi: {q!r} is not a quantity of interest; use a class index, a (c1, c2) pair, 'max', "
                      "a callable or a QuantityOfInterest")
