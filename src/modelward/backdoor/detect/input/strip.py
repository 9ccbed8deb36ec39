"""STRIP (Gao, Xu, Wang, Chen, Ranasinghe & Nepal, ACSAC 2019, "STRIP: A Defence Against Trojan Attacks on Deep
Neural Networks", §IV).

An input carrying a trigger is classified as the target whatever else is in the image, so blending it with
other clean images hardly changes the prediction; a clean input blended with other images loses its class. For an
input x, ``n`` copies are superimposed with clean images drawn from a held-out set and the mean Shannon entropy (in
bits) of the predictions on the copies is its score:

    H(x) = (1/n) Σ_j  −Σ_c p_c(x ⊕ x_j) log₂ p_c(x ⊕ x_j)

A low entropy means a trigger. The threshold comes from the clean inputs alone (the defender never sees a trigger):
a normal distribution is fitted to the clean entropies and the threshold is its ``frr`` quantile, so that about
``frr`` of clean inputs are flagged (the paper's false rejection rate; ``threshold="empirical"`` uses the empirical
quantile instead).

Superimposition: ``"add"`` is the paper's ``cv2.addWeighted(x, 1, x_j, 1, 0)`` (a saturating sum), ``"average"``
is ART's ``0.5·x + 0.5·x_j``.

:class:`StripMonitor` is the same test as a ``guard serve`` monitor (its ``[strip]`` section): it flags (or refuses)
requests whose rows look triggered, and counts them per key.
"""

from __future__ import annotations

import logging
import os
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

import numpy as np
import torch
from pydantic import Field
from torch import nn

from modelward.core.config import StrictModel
from modelward.core.modules import batched_logits
from modelward.errors import ConfigError, DataError

log = logging.getLogger("modelward.backdoor.strip")


class STRIP:
    """The entropy test.

    Args:
        n: clean images superimposed per input (the paper uses 100 and notes 20 suffice on small sets).
        blend: ``"add"`` (the paper's) or ``"average"`` (ART's).
        frr: the clean inputs' false rejection rate the threshold is set for (0.01).
        threshold: ``"normal"`` (the paper: a normal fit to the clean entropies) or ``"empirical"``.
        seed: seeds the choice of clean images (None: a fresh random seed, so a client cannot predict them).
        clip: the input box.

    Returns:
        A test: ``fit(model, x_clean)`` sets the threshold, ``detect(model, x)`` → ``(flags, entropies)``.

    Example:
        >>> strip = STRIP(n=20).fit(model, x_clean)  # doctest: +SKIP
        >>> flags, h = strip.detect(model, x)  # flags[i]: row i looks triggered  # doctest: +SKIP
    """

    name = "strip"

    def __init__(self, n: int = 20, blend: Literal["add", "average"] = "add", frr: float = 0.01,
                 threshold: Literal["normal", "empirical"] = "normal", seed: int | None = 0,
                 clip: tuple[float, float] = (0.0, 1.0)) -> None:
        if n < 1:
            raise ConfigError("strip: n must be ≥ 1")
        if not 0.0 < frr < 0.5:
            raise ConfigError(f"strip: frr must be in (0, 0.5), got {frr}")
        self.n, self.blend, self.frr, self.threshold_rule, self.clip = n, blend, frr, threshold, tuple(clip)
        seed = int.from_bytes(os.urandom(8), "little") if seed is None else seed
        self._gen = torch.Generator().manual_seed(seed)
        self._gen_lock = threading.Lock()
        self.clean: torch.Tensor | None = None
        self.threshold: float | None = None
        self.clean_entropy: np.ndarray | None = None

    def superimpose(self, x: torch.Tensor, others: torch.Tensor) -> torch.Tensor:
        if self.blend == "add":
            return (x + others).clamp(*self.clip)
        return 0.5 * x + 0.5 * others

    @torch.no_grad()
    def entropy(self, model: nn.Module, x: torch.Tensor, clean: torch.Tensor | None = None) -> torch.Tensor:
        """H(x) for every row of ``x`` (bits)."""
        pool = self.clean if clean is None else clean
        if pool is None:
            raise ConfigError("strip: call fit(model, x_clean) first (or pass the clean images)")
        with self._gen_lock:
            idx = torch.randint(0, len(pool), (len(x), self.n), generator=self._gen)
        mixed = self.superimpose(x[:, None], pool[idx]).flatten(0, 1)  # rows × n copies
        p = torch.softmax(batched_logits(model, mixed).float(), dim=1)
        h = -(p * torch.log2(p.clamp_min(1e-12))).sum(1)
        return h.view(len(x), self.n).mean(1)

    def fit(self, model: nn.Module, x_clean: torch.Tensor) -> STRIP:
        """Keep the clean images and set the threshold from their own entropies (each blended with others)."""
        if len(x_clean) < 2:
            raise ConfigError("strip: needs at least 2 clean images")
        self.clean = x_clean.detach().float().cpu()
        h = self.entropy(model, self.clean).numpy().astype(np.float64)
        self.clean_entropy = h
        if self.threshold_rule == "normal":
            from scipy.stats import norm

            self.threshold = float(norm.ppf(self.frr, loc=h.mean(), scale=max(h.std(ddof=1), 1e-12)))
        else:
            self.threshold = float(np.quantile(h, self.frr))
        return self

    def detect(self, model: nn.Module, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """``(flags, entropies)``: flags[i] is True when H(x_i) is below the threshold."""
        if self.threshold is None:
            raise ConfigError("strip: call fit(model, x_clean) first")
        h = self.entropy(model, x.detach().float().cpu())
        return h < self.threshold, h


class StripSection(StrictModel):
    """``[strip]`` of a GUARD.toml: STRIP on every request, before the model answers.

    Args:
        enabled: run the monitor.
        clean_data: an ``.npz`` with an array ``x`` of held-out clean inputs (the model's input shape), relative to
            the guard's config file; read without pickle.
        n, blend, frr, threshold: the test (:class:`STRIP`).
        action: ``"flag"`` — answer as usual, count the flagged rows per key (``GET /v2/guard/status``) and log a
            warning; ``"refuse"`` — refuse a request with a flagged row (nothing is charged; the caller then learns
            which inputs trip the monitor).
        seed: None (default): the clean images are drawn from a fresh random seed; an integer for reproducible tests.
    """

    enabled: bool = False
    clean_data: str | None = None
    n: int = Field(20, ge=1, le=256)
    blend: Literal["add", "average"] = "add"
    frr: float = Field(0.01, gt=0.0, lt=0.5)
    threshold: Literal["normal", "empirical"] = "normal"
    action: Literal["flag", "refuse"] = "flag"
    seed: int | None = None


@dataclass
class StripMonitor:
    """STRIP as a ``guard serve`` monitor: :meth:`check` a batch before it is answered.

    Attributes:
        strip: the fitted test; action: ``"flag"`` or ``"refuse"``; counts: key name → [requests flagged, rows
        flagged, rows checked].
    """

    strip: STRIP
    action: str
    counts: dict[str, list[int]] = field(default_factory=dict)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    @classmethod
    def from_section(cls, section: StripSection, model: nn.Module, base_dir: Path,
                     input_shape: tuple[int, ...]) -> StripMonitor | None:
        """Build and fit the monitor of a ``[strip]`` section (None when it is not enabled).

        Raises:
            ConfigError: ``clean_data`` missing, unreadable, or not of the model's input shape.
        """
        if not section.enabled:
            return None
        if not section.clean_data:
            raise ConfigError("strip.clean_data: give an .npz with an array 'x' of held-out clean inputs (STRIP "
                              "sets its threshold from them)")
        path = Path(section.clean_data)
        path = path if path.is_absolute() else base_dir / path
        try:
            with np.load(path, allow_pickle=False) as f:
                if "x" not in f:
                    raise ConfigError(f"strip.clean_data: {path} has no array 'x' (found {sorted(f.files)})")
                x = torch.as_tensor(np.asarray(f["x"], dtype=np.float32))
        except (OSError, ValueError) as e:
            raise ConfigError(f"strip.clean_data: cannot read {path} as .npz ({e})") from None
        if tuple(x.shape[1:]) != tuple(input_shape):
            raise ConfigError(f"strip.clean_data: {path} holds inputs of shape {tuple(x.shape[1:])}, the model "
                              f"takes {tuple(input_shape)}")
        try:
            strip = STRIP(n=section.n, blend=section.blend, frr=section.frr, threshold=section.threshold,
                          seed=section.seed).fit(model, x)
        except DataError as e:
            raise ConfigError(f"strip.clean_data: {e}") from None
        return cls(strip, section.action)

    def check(self, key: str, model: nn.Module, x: torch.Tensor) -> torch.Tensor:
        """The flagged rows of the batch ``x`` from key ``key`` (counted; a warning is logged when any is)."""
        flags, h = self.strip.detect(model, x)
        k = int(flags.sum())
        with self._lock:
            c = self.counts.setdefault(key, [0, 0, 0])
            c[0] += int(k > 0)
            c[1] += k
            c[2] += len(flags)
        if k:
            log.warning("strip: %d of %d rows from key %r look triggered (entropy %.3f < %.3f bits)", k, len(flags),
                        key, float(h.min()), self.strip.threshold)
        return flags

    def status(self) -> dict[str, object]:
        """The operator's view: the threshold and the per-key counts."""
        with self._lock:
            return {"action": self.action, "threshold_bits": self.strip.threshold, "n": self.strip.n,
                    "frr": self.strip.frr,
                    "keys": {k: {"requests_flagged": c[0], "rows_flagged": c[1], "rows_checked": c[2]}
                             for k, c in self.counts.items()}}
