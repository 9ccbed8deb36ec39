"""AutoAttack, bound propagation and randomized smoothing on CUDA (marked ``gpu``: skipped without a CUDA device).

Run on a GPU machine these caught two device bugs the CPU suite cannot see (Square drew its block of uniforms with
a CUDA generator on the CPU; CROWN made its constants on the CPU): each test checks that the work ran on the GPU
and agrees with the CPU where the two must agree — certificates are computed in float64 from the same weights, so
their margins agree to rounding; attacks draw from a generator on the input's device, so only their robust
accuracy is compared, within a few points.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch
from torch import nn

from modelward.core.data import load_data
from modelward.robustness.attacks import APGD, APGDT, FAB, AutoAttack, Square
from modelward.robustness.bounds import certify_bounds, output_bounds
from modelward.robustness.smoothing import SmoothedClassifier

pytestmark = pytest.mark.gpu
EX = Path(__file__).resolve().parents[2] / "examples"
DEVICE = os.environ.get("MODELWARD_GPU_TEST_DEVICE", "cuda")  # as in test_cuda_cli_paths.py


def _peak_reset() -> None:
    if DEVICE.startswith("cuda"):
        torch.cuda.reset_peak_memory_stats()


def _ran_on_device() -> bool:
    return not DEVICE.startswith("cuda") or torch.cuda.max_memory_allocated() > 0


def _relu_net() -> tuple[nn.Module, torch.Tensor, torch.Tensor]:
    d = load_data()
    torch.manual_seed(0)
    net = nn.Sequential(nn.Flatten(), nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 32), nn.ReLU(), nn.Linear(32, 10))
    opt = torch.optim.Adam(net.parameters(), 1e-2)
    for i in range(200):
        idx = torch.arange(i * 64 % 1344, i * 64 % 1344 + 64)
        opt.zero_grad()
        nn.functional.cross_entropy(net(d.x_train[idx]), d.y_train[idx]).backward()
        opt.step()
    return net.eval(), d.x_test[:48], d.y_test[:48]


@pytest.mark.parametrize("norm,eps", [("linf", 0.1), ("l2", 0.5)])
def test_autoattack_and_its_members_run_on_cuda_and_agree_with_cpu(norm: str, eps: float) -> None:
    net, x, y = _relu_net()
    kw = {"eps": eps, "norm": norm, "seed": 0}
    gpu = AutoAttack(net.to(DEVICE), steps=20, n_queries=300, **kw)(x.to(DEVICE), y.to(DEVICE))
    assert gpu.x_adv.device.type == torch.device(DEVICE).type
    delta = (gpu.x_adv.cpu() - x).flatten(1)
    assert float(delta.abs().amax() if norm == "linf" else delta.norm(dim=1).amax()) <= eps + 1e-5
    cpu = AutoAttack(net.cpu(), steps=20, n_queries=300, **kw)(x, y)
    assert abs(gpu.success_rate - cpu.success_rate) <= 0.07
    for member in (APGD(net.to(DEVICE), steps=10, **kw), APGDT(net, steps=10, **kw), FAB(net, steps=10, **kw),
                   Square(net, n_queries=200, **kw)):
        res = member(x.to(DEVICE), y.to(DEVICE))
        assert res.x_adv.device.type == torch.device(DEVICE).type and res.success.shape == y.shape


@pytest.mark.parametrize("method", ["ibp", "crown"])
@pytest.mark.parametrize("norm,eps", [("linf", 0.02), ("l2", 0.2)])
def test_bound_certificates_on_cuda_equal_the_cpu_ones(method: str, norm: str, eps: float) -> None:
    net, x, y = _relu_net()
    x, y = x[:16], y[:16]
    cpu = certify_bounds(net.cpu(), x, y, eps=eps, norm=norm, method=method)  # type: ignore[arg-type]
    gpu = certify_bounds(net.to(DEVICE), x.to(DEVICE), y.to(DEVICE), eps=eps, norm=norm, method=method)  # type: ignore[arg-type]
    assert torch.allclose(gpu.margin_lower, cpu.margin_lower, rtol=1e-9, atol=1e-9)
    assert torch.equal(gpu.certified, cpu.certified)
    lo, hi = output_bounds(net.to(DEVICE), x[:4].to(DEVICE), eps=eps, norm=norm, method=method)  # type: ignore[arg-type]
    with torch.no_grad():
        z = net(x[:4].to(DEVICE)).double()
    assert lo.device.type == torch.device(DEVICE).type and bool((lo <= z + 1e-9).all() and (z <= hi + 1e-9).all())


def test_smoothing_certificate_on_cuda_equals_the_cpu_one() -> None:
    net, x, y = _relu_net()
    args = {"n0": 50, "n": 2000, "alpha": 0.001}
    cpu = SmoothedClassifier(net.cpu(), 10, sigma=0.25, seed=0).certify(x[:6], y[:6], **args)
    _peak_reset()
    gpu = SmoothedClassifier(net.to(DEVICE), 10, sigma=0.25, seed=0).certify(x[:6].to(DEVICE), y[:6].to(DEVICE), **args)
    assert _ran_on_device()
    # the noise is drawn on the CPU in both runs: the same samples; the logits may differ in the last bits
    assert (gpu.predictions == cpu.predictions).float().mean() >= 5 / 6
    assert torch.allclose(gpu.radii, cpu.radii, atol=0.02)


def test_cli_autoattack_suite_with_crown_on_cuda(tmp_path: Path) -> None:
    from modelward.cli.main import main

    tiny = ["--set", "model.arch=c(4,4,2).d(16)", "--set", "train.epochs=3", "--set", "train.adversarial.attack_steps=2",
            "--set", "evaluate.max_points=40", "--set", "evaluate.epsilons=[0.1, 0.3]"]
    for argv in (["robust", "train", str(EX / "robust_pgd.toml"), "--out", str(tmp_path), *tiny],
                 ["robust", "attack", str(EX / "robust_pgd.toml"), "--model", str(tmp_path), "--out",
                  str(tmp_path / "aa"), "--suite", "autoattack", "--steps", "10", "--queries", "200", *tiny]):
        with pytest.raises(SystemExit) as e:
            main([*argv, "--device", DEVICE])
        assert e.value.code in (0, None), argv
    text = (tmp_path / "aa" / "sandwich.md").read_text()
    assert "crown" in text.lower()
