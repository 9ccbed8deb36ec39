"""One status per point and the robust-accuracy sandwich, with gradient-masking diagnostics.

At each ε every evaluation point gets exactly one status:

- ``certified`` by a certificate (``gloro``, ``crown``, ``ibp``: the first, in that order, that proves the model's
  prediction constant on the ball and equal to the label);
- ``broken`` by an attack (``clean`` if misclassified already, else the AutoAttack member that found the
  adversarial example, which is kept);
- ``unresolved`` otherwise.

The sandwich is ``certified fraction ≤ true robust accuracy ≤ 1 − broken fraction``; the gap is the unresolved
fraction. A point both certified and broken is a soundness failure of a certificate and raises an error.
(Randomized smoothing certifies the *smoothed* classifier, not the model, so it never enters this sandwich.)

Diagnostics (Athalye et al. 2018; Croce & Hein 2020, §5), flagged in ``diagnostics``:

- ``black_box_beats_white_box``: Square broke points that APGD-CE, APGD-T and FAB-T all missed;
- ``loss_not_increased``: at points the attack did not break, APGD-CE's final loss is not above the clean loss for
  a large share (> 10 %) of them (the gradient does not lead uphill); points whose softmax is saturated in float32
  (cross-entropy and gradient exactly 0) are left out of it and reported as ``ce_saturated`` (information: APGD-T's
  scale-free DLR loss attacks them; such entries carry ``"info": True`` and are printed as NOTE, not FLAG);
- ``not_monotone_in_eps``: the attacked robust accuracy rises with ε;
- ``stochastic_forward``: two eval-mode forward passes on the same input differ; the APGD members then average
  their gradients over ``eot_iter`` draws (expectation over transformation) and the flag says so.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from modelward.core.device import model_device
from modelward.errors import ConfigError, ModelwardError
from modelward.robustness.attacks.autoattack import STANDARD, AutoAttack
from modelward.robustness.attacks.base import attack_mode, predict
from modelward.robustness.bounds import certify_bounds
from modelward.robustness.gloro.certify import certify
from modelward.robustness.gloro.net import GloroNet

CERTIFICATES = ("gloro", "crown", "ibp")


class SoundnessError(ModelwardError):
    """A point was both certified and broken: the named certificate is unsound (never silently ignored)."""


@dataclass
class EpsResult:
    """Statuses at one ε: ``status[i]`` ∈ certified / broken / unresolved, ``by[i]`` the certificate or attack."""

    eps: float
    status: list[str]
    by: list[str | None]
    examples: dict[int, torch.Tensor] = field(default_factory=dict)  # broken point -> its adversarial example
    seconds: dict[str, float] = field(default_factory=dict)
    members: tuple[str, ...] = STANDARD  # the AutoAttack members that ran (fewer than 4 classes: the variant)

    def fraction(self, status: str) -> float:
        return sum(s == status for s in self.status) / max(1, len(self.status))

    def counts(self, status: str) -> dict[str, int]:
        out: dict[str, int] = {}
        for s, b in zip(self.status, self.by, strict=True):
            if s == status and b is not None:
                out[b] = out.get(b, 0) + 1
        return out

    def row(self) -> dict[str, Any]:
        n = max(1, len(self.status))
        n_cert, n_broken = self.status.count("certified"), self.status.count("broken")
        return {"eps": self.eps, "certified_lower": n_cert / n, "attacked_upper": (n - n_broken) / n,
                "gap": (n - n_broken - n_cert) / n, "certified_by": self.counts("certified"),
                "broken_by": self.counts("broken"), "unresolved": sum(s == "unresolved" for s in self.status),
                "seconds": dict(self.seconds)}


@dataclass
class RobustnessEvaluation:
    """Per-ε statuses, the certificates used (and those skipped, with why), and the diagnostics."""

    norm: str
    n: int
    clean_accuracy: float
    results: list[EpsResult]
    certificates: list[str]
    skipped: dict[str, str]
    diagnostics: list[dict[str, Any]]

    def to_dict(self, include_points: bool = False) -> dict[str, Any]:
        """Plain, JSON-ready data (``include_points``: per-point statuses too; examples stay out)."""
        out: dict[str, Any] = {"norm": self.norm, "n": self.n, "clean_accuracy": self.clean_accuracy,
                               "rows": [r.row() for r in self.results], "certificates": list(self.certificates),
                               "skipped_certificates": dict(self.skipped), "diagnostics": list(self.diagnostics),
                               "attack": _attack_name(self.results[0].members if self.results else STANDARD)}
        if include_points:
            out["points"] = {str(r.eps): [{"index": i, "status": s, "by": b}
                                          for i, (s, b) in enumerate(zip(r.status, r.by, strict=True))]
                             for r in self.results}
        return out


def _attack_name(members: tuple[str, ...]) -> str:
    kind = "standard" if members == STANDARD else f"{len(members)}-member variant for fewer than 4 classes"
    return f"AutoAttack ({kind}: " + ", ".join(members) + ")"


def is_stochastic(model: nn.Module, x: torch.Tensor, tries: int = 3) -> bool:
    """True when eval-mode forward passes on the same inputs disagree (randomness in the forward pass)."""
    with attack_mode(model), torch.no_grad():
        xb = x[:16].to(model_device(model))
        first = model(xb)
        return any(not torch.equal(first, model(xb)) for _ in range(tries))


def _certify(name: str, model: nn.Module, x: torch.Tensor, y: torch.Tensor, eps: float, norm: str,
             clip: tuple[float, float] = (0.0, 1.0)) -> torch.Tensor:
    if name == "gloro":
        if not isinstance(model, GloroNet):
            raise ConfigError("gloro certifies GloRo nets only (modelward.robustness.gloro.GloroNet)")
        if norm != "l2":
            raise ConfigError("gloro certifies ℓ2 balls only")
        c = certify(model, x, y, eps)
        return (c.robust_correct & (c.set_size <= 1)).cpu()

    # the ℓ∞ ball is intersected with the same box the attacks stay in (the data's own range, not always [0, 1])
    return certify_bounds(_base(model), x, y, eps, norm, name, clip).certified.cpu()  # type: ignore[arg-type]


def _base(model: nn.Module) -> nn.Module:
    """The classifier to attack: a GloRo net's underlying model (its ⊥ logit is not part of the prediction)."""
    return model.f if isinstance(model, GloroNet) else model


def evaluate_points(model: nn.Module, x: torch.Tensor, y: torch.Tensor, eps: float | Sequence[float],
                    norm: str = "l2", certificates: Sequence[str] | str = "auto", seed: int = 0,
                    attack_params: dict[str, Any] | None = None, eot_iter: int = 20,
                    clip: tuple[float, float] = (0.0, 1.0)) -> RobustnessEvaluation:
    """Certify, attack and classify every point at every ε (see the module docstring).

    Args:
        model: the classifier (an ``nn.Module`` returning logits, or a GloRo net).
        x, y: the evaluation points and labels.
        eps: one radius or a list.
        norm: ``"linf"`` or ``"l2"``.
        certificates: names among ``gloro``, ``crown``, ``ibp``, or ``"auto"`` (every one that applies).
        seed: seeds AutoAttack.
        attack_params: extra AutoAttack parameters (``steps``, ``n_queries``, ``n_target_classes``).
        eot_iter: gradient draws per APGD step when the forward pass is random.
        clip: the input box: attacks stay in it and the ℓ∞ certificates bound the ball intersected with it (give
            the data's own range for inputs outside [0, 1], or certificates would cover the wrong set).

    Returns:
        :class:`RobustnessEvaluation` (``to_dict()`` for plain data).

    Example:
        >>> import torch
        >>> from torch import nn
        >>> net = nn.Sequential(nn.Flatten(), nn.Linear(16, 8), nn.ReLU(), nn.Linear(8, 4))
        >>> ev = evaluate_points(net, torch.rand(6, 1, 4, 4), torch.randint(4, (6,)), [0.01], norm="linf",
        ...                      attack_params={"steps": 5, "n_queries": 10})
        >>> row = ev.to_dict()["rows"][0]
        >>> row["certified_lower"] <= row["attacked_upper"]
        True
    """
    if norm not in ("linf", "l2"):
        raise ConfigError(f"norm must be 'linf' or 'l2', got {norm!r}")
    eps_list = [float(eps)] if isinstance(eps, int | float) else [float(e) for e in eps]
    if not eps_list or min(eps_list) < 0:
        raise ConfigError("eps must be one radius >= 0 or a non-empty list of them")
    wanted = list(CERTIFICATES) if certificates == "auto" else list(certificates)
    bad = [c for c in wanted if c not in CERTIFICATES]
    if bad:
        raise ConfigError(f"certificates {bad} unknown; valid: {', '.join(CERTIFICATES)} (randomized smoothing "
                          "certifies the smoothed classifier, not this model, and is reported separately)")
    base = _base(model)
    dev = model_device(base)
    x, y = x.detach().to(dev), y.detach().long().to(dev)
    with attack_mode(base):
        correct = (predict(base, x) == y).cpu()
    stochastic = is_stochastic(base, x)
    params = dict(attack_params or {})
    box = params.get("clip", clip)  # a box given with the attack's parameters is the same box
    params["clip"] = (float(box[0]), float(box[1]))
    diagnostics: list[dict[str, Any]] = []
    if stochastic:
        params.setdefault("eot_iter", eot_iter)
        diagnostics.append({"flag": "stochastic_forward", "eps": None,
                            "detail": f"the forward pass is random; APGD members average {params['eot_iter']} "
                                      "gradient draws (EOT) and a single evaluation decides 'broken'"})
    usable, skipped = [], {}
    for name in wanted:
        try:
            _certify(name, model, x[:1], y[:1], eps_list[0], norm, params["clip"])
            usable.append(name)
        except ConfigError as e:
            skipped[name] = str(e)
    results = []
    for e in eps_list:
        res = _one_eps(model, base, x, y, correct, e, norm, usable, seed, params, diagnostics)
        results.append(res)
    uppers = [1 - r.fraction("broken") for r in results]
    order = sorted(range(len(eps_list)), key=lambda i: eps_list[i])
    for a, b in zip(order, order[1:], strict=False):
        if uppers[b] > uppers[a] + 1e-12:
            diagnostics.append({"flag": "not_monotone_in_eps", "eps": eps_list[b],
                                "detail": f"attacked robust accuracy {uppers[b]:.3f} at ε={eps_list[b]} is above "
                                          f"{uppers[a]:.3f} at ε={eps_list[a]}"})
    return RobustnessEvaluation(norm, len(y), float(correct.float().mean()), results, usable, skipped, diagnostics)


def _one_eps(model: nn.Module, base: nn.Module, x: torch.Tensor, y: torch.Tensor, correct: torch.Tensor,
             eps: float, norm: str, certs: list[str], seed: int, params: dict[str, Any],
             diagnostics: list[dict[str, Any]]) -> EpsResult:
    import time

    n = len(y)
    status = ["unresolved"] * n
    by: list[str | None] = [None] * n
    seconds: dict[str, float] = {}
    for name in certs:
        t0 = time.perf_counter()
        ok = _certify(name, model, x, y, eps, norm, params["clip"]) & correct
        seconds[name] = time.perf_counter() - t0
        for i in ok.nonzero().squeeze(1).tolist():
            if status[i] == "unresolved":
                status[i], by[i] = "certified", name
    t0 = time.perf_counter()
    res = AutoAttack(base, eps=eps, norm=norm, seed=seed, **params)(x, y)  # type: ignore[arg-type]
    seconds["autoattack"] = time.perf_counter() - t0
    examples: dict[int, torch.Tensor] = {}
    for i, who in enumerate(res.broken_by):
        if who is None:
            continue
        if status[i] == "certified":
            raise SoundnessError(f"point {i} at ε={eps} ({norm}) is certified by {by[i]} but {who} broke it: "
                                 "the certificate is unsound")
        status[i], by[i] = "broken", who
        examples[i] = res.x_adv[i].detach().cpu()
    counts = res.counts()
    if counts.get("square", 0) > 0:
        diagnostics.append({"flag": "black_box_beats_white_box", "eps": eps,
                            "detail": f"Square (black-box) broke {counts['square']} point(s) that APGD-CE, APGD-T "
                                      "and FAB-T missed: gradients may be masked"})
    alive = ~res.success
    if bool(alive.any()) and eps > 0:
        # unbroken points keep APGD-CE's highest-loss point. A point whose softmax is saturated (p_y == 1 in
        # float32: cross-entropy and its gradient exactly 0) cannot be moved by APGD-CE on an honest net either;
        # it is not counted as masking but noted (the scale-free DLR loss of APGD-T covers it)
        with attack_mode(base), torch.no_grad():
            z = base(x[alive])
            saturated = z.softmax(1).gather(1, y[alive].view(-1, 1)).squeeze(1) == 1.0
            loss_clean = F.cross_entropy(z.double(), y[alive], reduction="none")
            loss_adv = F.cross_entropy(base(res.x_adv[alive]).double(), y[alive], reduction="none")
        live = ~saturated
        if bool(live.any()):
            flat = float((loss_adv[live] <= loss_clean[live] * (1 + 1e-4)).float().mean())
            if flat > 0.1:
                diagnostics.append({"flag": "loss_not_increased", "eps": eps,
                                    "detail": f"at {100 * flat:.0f}% of the unbroken points whose softmax is not "
                                              "saturated, APGD-CE's final loss is not above the clean loss: the "
                                              "gradient does not lead uphill"})
        share = float(saturated.float().mean())
        if share > 0.1:
            diagnostics.append({"flag": "ce_saturated", "eps": eps, "info": True,
                                "detail": f"at {100 * share:.0f}% of the unbroken points the softmax is saturated "
                                          "(cross-entropy and its gradient are 0 in float32): APGD-CE cannot move "
                                          "them; APGD-T's scale-free DLR loss attacks them (information, not masking)"})
    return EpsResult(eps, status, by, examples, seconds, res.members)


def robustness_sandwich(model: nn.Module, x: torch.Tensor, y: torch.Tensor, eps: float | Sequence[float],
                        norm: str = "l2", certificates: Sequence[str] | str = "auto", seed: int = 0,
                        attack_params: dict[str, Any] | None = None, include_points: bool = False,
                        clip: tuple[float, float] = (0.0, 1.0)) -> dict[str, Any]:
    """The robust-accuracy sandwich as plain data (for reports): per ε the certified lower bound, the AutoAttack
    upper bound, the gap, who certified / broke how many points; plus the certificates used or skipped and the
    gradient-masking diagnostics. Same arguments as :func:`evaluate_points`.

    Example:
        >>> import torch
        >>> from torch import nn
        >>> net = nn.Sequential(nn.Flatten(), nn.Linear(16, 8), nn.ReLU(), nn.Linear(8, 4))
        >>> s = robustness_sandwich(net, torch.rand(6, 1, 4, 4), torch.randint(4, (6,)), 0.01, "linf",
        ...                         attack_params={"steps": 5, "n_queries": 10})
        >>> sorted(s["rows"][0])[:4]
        ['attacked_upper', 'broken_by', 'certified_by', 'certified_lower']
    """
    return evaluate_points(model, x, y, eps, norm, certificates, seed, attack_params,
                           clip=clip).to_dict(include_points)
