"""One status per point and the sandwich: certified ≤ robust ≤ attacked, a lying certificate is caught, and the
gradient-masking diagnostics fire on models built to mask gradients (and stay quiet on an honest one)."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from modelward.errors import ConfigError
from modelward.robustness.attacks.base import predict
from modelward.robustness.evaluation import SoundnessError, evaluate_points, robustness_sandwich

torch.set_num_threads(1)
FAST = {"steps": 20, "n_queries": 200, "n_target_classes": 3}


def test_every_point_has_one_status_and_the_sandwich_holds(victim, batch):
    x, y = batch[0][:24], batch[1][:24]
    ev = evaluate_points(victim, x, y, [0.0, 0.02, 0.08], norm="linf", attack_params=FAST)
    assert ev.certificates == ["crown", "ibp"] and "gloro" in ev.skipped
    rows = ev.to_dict(include_points=True)["rows"]
    for r, res in zip(rows, ev.results, strict=True):
        assert set(res.status) <= {"certified", "broken", "unresolved"} and len(res.status) == len(y)
        assert r["certified_lower"] <= r["attacked_upper"]
        assert r["gap"] == pytest.approx(r["unresolved"] / len(y))
        for i, ex in res.examples.items():  # every broken point comes with an example that really is misclassified
            assert res.status[i] == "broken"
            assert int(predict(victim, ex[None])[0]) != int(y[i])
            assert float((ex - x[i]).abs().max()) <= res.eps + 1e-6
    assert rows[0]["certified_lower"] == rows[0]["attacked_upper"] == ev.clean_accuracy  # ε = 0: no gap
    assert rows[1]["certified_lower"] > 0 and rows[2]["attacked_upper"] < rows[1]["attacked_upper"]
    assert not ev.diagnostics  # an honest MLP raises no flag


def test_a_certified_point_that_is_broken_raises(victim, batch, monkeypatch):
    import modelward.robustness.evaluation as ev_mod

    x, y = batch[0][:10], batch[1][:10]
    monkeypatch.setattr(ev_mod, "_certify",
                        lambda name, model, x, y, eps, norm, clip=(0.0, 1.0): torch.ones(len(y), dtype=torch.bool))
    with pytest.raises(SoundnessError, match="unsound"):
        evaluate_points(victim, x, y, 0.3, norm="linf", certificates=["ibp"], attack_params=FAST)


class _Masked(nn.Module):
    """Gradient masking: the input is quantised to a 1/4 grid before the model (zero gradient everywhere)."""

    def __init__(self, inner: nn.Module) -> None:
        super().__init__()
        self.inner = inner

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.inner(torch.round(x * 4) / 4)  # input quantisation: ∇ₓ = 0


class _Noisy(nn.Module):
    def __init__(self, inner: nn.Module) -> None:
        super().__init__()
        self.inner = inner

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.inner(x + 0.01 * torch.randn_like(x))


def test_masked_gradients_are_flagged(victim, batch):
    x, y = batch[0][:20], batch[1][:20]
    ev = evaluate_points(_Masked(victim), x, y, 0.15, norm="linf", attack_params=FAST)
    flags = {d["flag"] for d in ev.diagnostics}
    assert "black_box_beats_white_box" in flags or "loss_not_increased" in flags
    assert ev.results[0].counts("broken").get("square", 0) > 0  # the black-box attack does the breaking


class _Confident(nn.Module):
    """An honest net with its logits scaled ×1000: the cross-entropy is exactly 0 in float32 at most points (its
    gradient too, so APGD-CE cannot move), but the scale-free DLR loss of APGD-T still leads uphill."""

    def __init__(self, inner: nn.Module) -> None:
        super().__init__()
        self.inner = inner

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return 1000 * self.inner(x)


def test_a_confident_honest_net_is_not_flagged_but_zero_gradients_are(victim, batch):
    x, y = batch[0][:20], batch[1][:20]
    # saturated points are noted, not counted as masking (the DLR loss of APGD-T still attacks them)
    honest = evaluate_points(_Confident(victim), x, y, 0.02, norm="linf", certificates=[], attack_params=FAST)
    flags = {d["flag"] for d in honest.diagnostics}
    assert "loss_not_increased" not in flags and "ce_saturated" in flags
    white_box = {**FAST, "attacks": ("apgd-ce",)}
    masked = evaluate_points(_Masked(victim), x, y, 0.05, norm="linf", certificates=[], attack_params=white_box)
    assert "loss_not_increased" in {d["flag"] for d in masked.diagnostics}


def test_random_forward_is_flagged_and_attacked_with_eot(victim, batch):
    x, y = batch[0][:12], batch[1][:12]
    s = robustness_sandwich(_Noisy(victim), x, y, 0.05, "linf", certificates=[],
                            attack_params={"steps": 10, "n_queries": 50, "n_target_classes": 2, "eot_iter": 3})
    assert any(d["flag"] == "stochastic_forward" and "3 gradient draws" in d["detail"] for d in s["diagnostics"])


def test_bad_arguments_are_refused(victim, batch):
    x, y = batch[0][:4], batch[1][:4]
    with pytest.raises(ConfigError, match="smoothing"):
        evaluate_points(victim, x, y, 0.1, certificates=["smoothing"])
    with pytest.raises(ConfigError, match="norm"):
        evaluate_points(victim, x, y, 0.1, norm="l1")
