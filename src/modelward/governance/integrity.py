"""Integrity of a step: refuse what is an outlier against the party's own running statistics (issue 26 item 4).

The numeric check of a party catches non-finite or exploding values only (``max_abs_input``, ``max_abs_param``).
A neighbour that sends activations far inside those limits can still wreck a part in one committed step: on the
digits demo, ``h = 300·N(0, 1)`` (``max |h|`` about 1.5e3, against a limit of 1e6) took Bob's test accuracy from
0.98 to 0.10, and about 50 honest steps to recover. A party therefore keeps running statistics of what its steps
look like, and refuses a step whose

1. **incoming tensor** (the activation ``h`` from the previous party) has a root-mean-square, or a largest
   magnitude, far beyond its running average — checked before anything is computed, so nothing changes;
2. **update** ``‖θ_{s+1} − θ_s‖₂`` is far beyond its running average — checked after the tentative update, which
   is then rolled back bit for bit (the two-phase protocol of :mod:`.party`);
3. **loss** jumps far above its running mean (label holder), by all three of: ``loss > mean + k·std``,
   ``loss > ratio·mean`` and ``loss − mean > floor`` (late in training a batch's loss can be several times the
   mean, so no single criterion is safe).

The statistics are exponential moving averages of the logarithm (magnitudes) or of the value (loss): they follow
a learning-rate schedule and the natural drift of training, and one refused step does not move them (a value is
recorded only once its step passed every check). During ``warmup_steps`` values are recorded but nothing is
refused. The thresholds are wide on purpose: over a normal demo run nothing is refused (tested on the digits CNN,
200 steps), while the in-bounds poisoning above is 300× beyond the activation statistics.

Example:
    >>> import torch
    >>> mon = IntegrityMonitor(IntegrityConfig(warmup_steps=2))
    >>> for _ in range(3):
    ...     mon.record(mon.check_input("h", torch.randn(64, 8)))
    >>> try:
    ...     mon.check_input("h", 300 * torch.randn(64, 8))
    ... except IntegrityError as e:
    ...     print(str(e)[:28])
    incoming h: root-mean-square
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch
from pydantic import Field

from modelward.core.config import StrictModel
from modelward.errors import ModelwardError


class IntegrityError(ModelwardError):
    """A step refused as an outlier against the party's running statistics (it is rolled back, or never run)."""


class IntegrityConfig(StrictModel):
    """``[integrity]`` of PARTY.toml: how far from its running statistics a step may be.

    Args:
        enabled: check at all (default true).
        warmup_steps: steps recorded before anything is refused.
        decay: the moving averages' decay per recorded step (0.9: about the last 10 steps weigh most).
        max_input_ratio: an incoming tensor's RMS or max |value| may be at most this many times its average.
        max_update_ratio: an update's norm may be at most this many times its average.
        loss_sigmas / loss_ratio / loss_floor: a loss is an outlier when it exceeds the mean by ``loss_sigmas``
            standard deviations, is ``loss_ratio`` times the mean, and exceeds it by ``loss_floor`` (nats).

    Returns:
        A strict config for :class:`IntegrityMonitor`.

    Example:
        >>> IntegrityConfig().max_input_ratio
        10.0
    """

    enabled: bool = True
    warmup_steps: int = Field(20, ge=1)
    decay: float = Field(0.9, gt=0.0, lt=1.0)
    max_input_ratio: float = Field(10.0, gt=1.0)
    max_update_ratio: float = Field(10.0, gt=1.0)
    loss_sigmas: float = Field(8.0, gt=0.0)
    loss_ratio: float = Field(3.0, gt=1.0)
    loss_floor: float = Field(1.0, ge=0.0)


@dataclass
class _Ema:
    """Exponential moving mean and variance (West 1979's weighted incremental form)."""

    mean: float = 0.0
    var: float = 0.0
    n: int = 0

    def add(self, x: float, decay: float) -> None:
        if self.n == 0:
            self.mean, self.var = x, 0.0
        else:
            d = x - self.mean
            self.mean += (1 - decay) * d
            self.var = decay * (self.var + (1 - decay) * d * d)
        self.n += 1


@dataclass
class Sample:
    """What a step contributed, recorded once the step passed (:meth:`IntegrityMonitor.record`)."""

    values: dict[str, float] = field(default_factory=dict)

    def merge(self, other: Sample) -> Sample:
        return Sample({**self.values, **other.values})


def _rms_and_max(t: torch.Tensor) -> tuple[float, float]:
    t = t.detach().float()
    if t.numel() == 0:
        return 0.0, 0.0
    return float(t.pow(2).mean().sqrt()), float(t.abs().max())


class IntegrityMonitor:
    """Running statistics of one party's steps and the outlier checks on them (module docstring).

    Args:
        cfg: :class:`IntegrityConfig`.

    Returns:
        ``check_input(name, t)``, ``check_update(norm)``, ``check_loss(loss)`` raise :class:`IntegrityError` on an
        outlier and return a :class:`Sample`; ``record(sample)`` adds a passed step's values to the statistics.
        ``state()`` / ``load_state(d)`` keep them across restarts (plain floats, for a checkpoint's metadata).

    Example:
        >>> mon = IntegrityMonitor(IntegrityConfig(warmup_steps=1))
        >>> mon.record(mon.check_update(0.5))
        >>> mon.check_update(0.6).values
        {'update': 0.6}
    """

    def __init__(self, cfg: IntegrityConfig | None = None) -> None:
        self.cfg = cfg or IntegrityConfig()
        self.stats: dict[str, _Ema] = {}
        self.refusals = 0

    def _warm(self, key: str) -> bool:
        s = self.stats.get(key)
        return s is not None and s.n >= self.cfg.warmup_steps

    def _ratio_check(self, key: str, value: float, limit: float, what: str) -> None:
        if not self.cfg.enabled or not self._warm(key) or value <= 0:
            return
        avg = math.exp(self.stats[key].mean)
        if value > limit * avg:
            self.refusals += 1
            raise IntegrityError(f"{what} {value:.3g} is {value / avg:.3g}x its running average {avg:.3g} (limit "
                                 f"{limit:g}x, integrity.max_{'input' if key.startswith('in:') else 'update'}_ratio)"
                                 "; refused as an outlier")

    def check_input(self, name: str, t: torch.Tensor) -> Sample:
        """An incoming tensor's RMS and max |value| against their running averages (before any compute)."""
        rms, mx = _rms_and_max(t)
        self._ratio_check(f"in:{name}:rms", rms, self.cfg.max_input_ratio, f"incoming {name}: root-mean-square")
        self._ratio_check(f"in:{name}:max", mx, self.cfg.max_input_ratio, f"incoming {name}: max |value|")
        return Sample({f"in:{name}:rms": rms, f"in:{name}:max": mx})

    def check_update(self, norm: float, key: str = "update") -> Sample:
        """The norm of a tentative update ``‖θ_{s+1} − θ_s‖₂`` (or of the buffers' change, `key` ``"buffers"``)
        against its running average."""
        if not math.isfinite(norm):
            raise IntegrityError(f"{key} change {norm} is not finite; refused")
        self._ratio_check(key, norm, self.cfg.max_update_ratio, "update norm" if key == "update"
                          else f"{key} change norm")
        return Sample({key: norm})

    def check_loss(self, loss: float) -> Sample:
        """A step's loss against its running mean and standard deviation (all three criteria must hold)."""
        c = self.cfg
        s = self.stats.get("loss")
        if c.enabled and s is not None and s.n >= c.warmup_steps:
            std = math.sqrt(max(s.var, 0.0))
            if (not math.isfinite(loss)) or (loss > s.mean + c.loss_sigmas * std and loss > c.loss_ratio * s.mean
                                             and loss - s.mean > c.loss_floor):
                self.refusals += 1
                raise IntegrityError(f"loss {loss:.4g} jumps from its running mean {s.mean:.4g} (std {std:.3g}; "
                                     f"limits: +{c.loss_sigmas:g} std, {c.loss_ratio:g}x and +{c.loss_floor:g}, "
                                     "integrity.loss_*); refused as an outlier")
        return Sample({"loss": loss})

    def record(self, sample: Sample) -> None:
        """Add a passed step's values (magnitudes in log space, the loss as is)."""
        for k, v in sample.values.items():
            if k != "loss":
                if v <= 0 or not math.isfinite(v):
                    continue
                v = math.log(v)
            self.stats.setdefault(k, _Ema()).add(v, self.cfg.decay)

    def state(self) -> dict[str, list[float]]:
        return {k: [s.mean, s.var, float(s.n)] for k, s in self.stats.items()}

    def load_state(self, state: dict[str, list[float]]) -> None:
        self.stats = {str(k): _Ema(float(v[0]), float(v[1]), int(v[2])) for k, v in state.items()}


def update_norm(before: list[torch.Tensor], after: list[torch.Tensor]) -> float:
    """``‖after − before‖₂`` over a list of tensors (the parameters before and after an optimizer step)."""
    pairs = [(a, b) for a, b in zip(after, before, strict=True) if a.is_floating_point() and a.numel()]
    if not pairs:
        return 0.0
    diffs = torch._foreach_sub([a.detach() for a, _ in pairs], [b.detach() for _, b in pairs])
    return float(torch.stack(torch._foreach_norm(diffs)).norm())


class StepIntegrity:
    """The party's side of the checks, one step at a time: :meth:`incoming` before the step computes anything,
    :meth:`after_update` once its tentative update is applied (the party rolls the step back on IntegrityError);
    a step's values join the statistics only when every check passed.

    Args:
        cfg: :class:`IntegrityConfig` (None: the defaults).

    Example:
        >>> si = StepIntegrity(IntegrityConfig(warmup_steps=1))
        >>> si.incoming("h", torch.ones(4, 3))
        >>> si.after_update([torch.zeros(3)], [torch.ones(3)], loss=0.7)
        >>> sorted(si.monitor.stats)
        ['in:h:max', 'in:h:rms', 'loss', 'update']
    """

    def __init__(self, cfg: IntegrityConfig | None = None) -> None:
        self.monitor = IntegrityMonitor(cfg)
        self._pending = Sample()

    @property
    def enabled(self) -> bool:
        return self.monitor.cfg.enabled

    def incoming(self, name: str, t: torch.Tensor) -> None:
        """Check an incoming tensor of the step about to run (IntegrityError: refuse it, nothing computed)."""
        self._pending = self.monitor.check_input(name, t)

    def after_update(self, before: list[torch.Tensor], after: list[torch.Tensor], loss: float | None = None,
                     buffers_before: list[torch.Tensor] | None = None,
                     buffers_after: list[torch.Tensor] | None = None) -> None:
        """Check the tentative update of the parameters and, given them, of the float buffers (BatchNorm's running
        statistics: an activation scaled far up barely moves a normalised loss but wrecks them), and the loss for
        the label holder; record the step if it passed."""
        sample, self._pending = self._pending, Sample()
        sample = sample.merge(self.monitor.check_update(update_norm(before, after)))
        if buffers_before is not None and buffers_after is not None:
            norm = update_norm(buffers_before, buffers_after)
            if norm > 0:
                sample = sample.merge(self.monitor.check_update(norm, "buffers"))
        if loss is not None:
            sample = sample.merge(self.monitor.check_loss(loss))
        self.monitor.record(sample)

    def forget(self) -> None:
        """Drop the values of a step that did not run to its update (refused or failed elsewhere)."""
        self._pending = Sample()
