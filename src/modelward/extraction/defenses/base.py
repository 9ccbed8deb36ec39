"""Common base of prediction-perturbation defenses (ModelGuard paper, Sec. 2–3, Eq. 5–7).

A defense maps a batch of clean probability vectors ``y`` (B×K, rows on the simplex) to a batch of answers ``ŷ``.
The three validity conditions of the paper are exposed as helpers so tests, the harness and the service can check
any defense the same way:

* Eq. 5 distortion   ``‖ŷ − y‖₁ ≤ ε``           (:func:`l1_distortion`, only for defenses with ``epsilon``)
* Eq. 6 top-1        ``argmax ŷ = argmax y``     (only for defenses with ``preserves_top1``)
* Eq. 7 simplex      ``Σ ŷ = 1, ŷ ≥ 0``          (:func:`is_in_simplex`, tolerance 1e-4 as the official code)
"""

from __future__ import annotations

from typing import ClassVar, Protocol, runtime_checkable

import numpy as np
import torch
from torch import Tensor

from modelward.errors import DataError

SIMPLEX_TOL = 1e-4  # the official code's is_in_simplex tolerance


def as_probs(probs: Tensor, name: str = "probs") -> Tensor:
    """Validate a B×K batch of probability vectors; return it as float64 rows summing to 1 (defenses compute in
    float64)."""
    if not torch.is_tensor(probs):
        raise DataError(f"{name}: expected a torch.Tensor, got {type(probs).__name__}")
    if probs.dim() != 2 or probs.shape[1] < 2:
        raise DataError(f"{name}: expected shape [batch, num_classes>=2], got {list(probs.shape)}")
    # numpy: these checks run on every query, and numpy's per-call overhead is a fraction of torch's
    p = probs.detach().to(device="cpu", dtype=torch.float64).numpy().copy()
    if not np.isfinite(p).all():
        raise DataError(f"{name}: contains NaN or infinite values")
    sums = p.sum(1)
    if (p < -SIMPLEX_TOL).any() or (np.abs(sums - 1.0) > 1e-3).any():
        raise DataError(f"{name}: rows must be probability vectors (non-negative, summing to 1)")
    np.maximum(p, 0.0, out=p)
    p /= p.sum(1, keepdims=True)  # exact sum 1 in float64 (float32 softmax sums are off by ~1e-7)
    return torch.from_numpy(p)


def is_in_simplex(probs: Tensor, tol: float = SIMPLEX_TOL) -> Tensor:
    """Per-row check of Eq. 7 (sum 1, non-negative) with tolerance ``tol``; returns a bool vector."""
    return ((probs.sum(1) - 1.0).abs() <= tol) & (probs >= -tol).all(1)


def l1_distortion(y: Tensor, y_hat: Tensor) -> Tensor:
    """Per-row ℓ1 distortion ‖ŷ − y‖₁ (Eq. 5)."""
    return (y_hat.to(torch.float64) - y.to(torch.float64)).abs().sum(1)


def top1_kept(y: Tensor, y_hat: Tensor) -> Tensor:
    """Per-row check of Eq. 6."""
    return y.argmax(1) == y_hat.argmax(1)


class PredictionDefense:
    """A prediction-perturbation mechanism ``p`` (the paper's ŷ = p(y)).

    Subclasses implement :meth:`_defend` on float64 batches. Conventions:

    * ``name``: the registry name (``make_defense(name, ...)``).
    * ``preserves_top1``: Eq. 6 holds for every output.
    * ``epsilon``: the ℓ1 budget of Eq. 5, or ``None`` where the defense is not ℓ1-bounded.
    * ``needs_inputs``: ``defend`` must be given the queried inputs ``x`` (MAD, AdaptiveMisinformation).
    * ``stateful``: answers depend on earlier queries (ModelGuard-S); such defenses process a batch row by row in
      arrival order, implement :meth:`state_dict` / :meth:`load_state_dict`, and offer ``defend_frozen`` — the
      attacker's offline copy (``get_yprime`` in the official code) that answers without changing the state. A
      stateful defense whose state only grows may also implement :class:`IncrementalState` (the guard then persists
      each addition instead of a whole snapshot).
    * ``fast``: the answer for a full batch takes well under a millisecond (the guard answers small requests on its
      event loop rather than paying a thread hop).
    * ``needs``: the models :func:`~modelward.extraction.defenses.build_defense` must supply as keyword parameters
      (``("surrogate",)`` for MAD, ``("misinformation",)`` for AdaptiveMisinformation).

    Args:
        (subclass-specific; see :func:`~modelward.extraction.defenses.make_defense`).

    Returns:
        ``defend(probs, x=None)``: the B × K perturbed probability vectors, on the simplex.

    Example (a defense of your own)::

        class Sharpen(PredictionDefense):
            name = "sharpen"

            def _defend(self, y, x):
                y2 = y ** 2
                return y2 / y2.sum(1, keepdim=True)
    """

    name: str = "base"
    preserves_top1: bool = True
    epsilon: float | None = None
    needs_inputs: bool = False
    stateful: bool = False
    fast: ClassVar[bool] = False
    needs: ClassVar[tuple[str, ...]] = ()

    def defend(self, probs: Tensor, x: Tensor | None = None) -> Tensor:
        """Perturb a B×K batch of clean probabilities; returns a B×K batch in the input's dtype."""
        y = as_probs(probs)
        if self.needs_inputs:
            if x is None:
                raise DataError(f"defense {self.name!r} needs the queried inputs x (defend(probs, x))")
            if x.shape[0] != y.shape[0]:
                raise DataError(f"defense {self.name!r}: x has {x.shape[0]} rows but probs has {y.shape[0]}")
        out = self._defend(y, x)
        return out.to(probs.dtype if probs.dtype.is_floating_point else torch.float32)

    def defend_frozen(self, probs: Tensor, x: Tensor | None = None) -> Tensor:
        """Apply the mechanism without changing any state (the attacker's reproduction; same as defend here)."""
        return self.defend(probs, x)

    def _defend(self, y: Tensor, x: Tensor | None) -> Tensor:
        raise NotImplementedError

    def params(self) -> dict[str, float | int | str | bool | None]:
        """The defense's hyper-parameters (for reports and the service's metadata)."""
        return {"epsilon": self.epsilon}

    def state_dict(self) -> dict[str, Tensor]:
        """Tensors describing the mutable state (empty for stateless defenses)."""
        return {}

    def load_state_dict(self, state: dict[str, Tensor]) -> None:
        if state:
            raise DataError(f"defense {self.name!r} is stateless but a non-empty state was given: {sorted(state)}")

    def __repr__(self) -> str:
        args = ", ".join(f"{k}={v}" for k, v in self.params().items())
        return f"{type(self).__name__}({args})"


@runtime_checkable
class IncrementalState(Protocol):
    """A stateful defense whose state is an append-only sequence of centroids (ModelGuard-S, Algorithm 1).

    ``centroids_since(n)`` returns what was added after the first ``n``; ``extend_centroids`` replays such a tail onto
    an earlier state; ``truncate_centroids(n)`` drops everything after the first ``n`` (undoes a batch whose answer
    could not be committed). The guard stores each tail as it appears and replays the rows after the last snapshot on start.
    """

    @property
    def num_centroids(self) -> int: ...

    def centroids_since(self, start: int) -> tuple[np.ndarray, np.ndarray]: ...

    def extend_centroids(self, labels: np.ndarray, vectors: np.ndarray) -> None: ...

    def truncate_centroids(self, n: int) -> None: ...


class NoDefense(PredictionDefense):
    """The undefended API: ŷ = y.

    Args:
        (none)

    Returns:
        ``defense.defend(probs)`` (``probs``: a B × K batch of probability vectors) returns the perturbed vectors,
        B × K on the simplex; ``x=`` passes the queried inputs to defenses that need them.

    Example:
        >>> import torch
        >>> y = torch.tensor([[0.7, 0.2, 0.1], [0.4, 0.35, 0.25]])
        >>> torch.allclose(NoDefense().defend(y), y)
        True
    """

    name = "none"
    epsilon = 0.0
    fast = True

    def _defend(self, y: Tensor, x: Tensor | None) -> Tensor:
        return y.clone()

    def params(self) -> dict[str, float | int | str | bool | None]:
        return {}
