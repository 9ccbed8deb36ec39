"""The main paths on CUDA (marked ``gpu``: skipped on machines without one, run on a GPU machine).

Each test also checks that the work really happened on the GPU (parameters and results on ``cuda``) and that
it agrees with the CPU where the two should agree.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from modelward.core.data import load_data
from modelward.core.device import resolve_device
from modelward.core.train import Checkpointing, TrainConfig, evaluate, train
from modelward.core.zoo import ModelConfig, build_model

pytestmark = pytest.mark.gpu


def _digits_cnn(device: torch.device) -> tuple[torch.nn.Module, object]:
    d = load_data()
    torch.manual_seed(0)
    return build_model(ModelConfig(arch="cnn"), d.input_shape, d.num_classes).to(device), d


def test_training_and_evaluation_run_on_cuda(tmp_path: Path) -> None:
    dev = resolve_device("cuda")
    model, d = _digits_cnn(dev)
    cfg = TrainConfig(steps=60, eval_every=20, batch_size=64)
    res = train(model, d.x_train, d.y_train, d.x_test, d.y_test, cfg, seed=0,
                checkpoint=Checkpointing(tmp_path / "c.safetensors", every=20))
    assert all(p.device.type == "cuda" for p in model.parameters())
    assert res.curve[-1][1] < res.curve[0][1]
    assert evaluate(model, d.x_test, d.y_test) == pytest.approx(res.curve[-1][1])
    # a resumed run loads its checkpoint onto the model's device
    again, _ = _digits_cnn(dev)
    res2 = train(again, d.x_train, d.y_train, d.x_test, d.y_test, cfg, seed=0,
                 checkpoint=Checkpointing(tmp_path / "c.safetensors", every=20))
    assert res2.curve == res.curve


def test_pgd_on_cuda_agrees_with_cpu() -> None:
    from modelward.robustness.attacks import make_attack

    model, d = _digits_cnn(resolve_device("cuda"))
    model.eval()
    x, y = d.x_test[:64], d.y_test[:64]
    res = make_attack("pgd", model, eps=0.1, steps=10, seed=0)(x.cuda(), y.cuda())
    assert res.x_adv.device.type == "cuda"
    cpu = make_attack("pgd", model.cpu(), eps=0.1, steps=10, seed=0)(x, y)
    assert abs(res.success_rate - cpu.success_rate) <= 0.05


def test_gloro_certification_on_cuda_matches_cpu() -> None:
    from modelward.robustness.gloro.certify import certify
    from modelward.robustness.gloro.layers import build_gloro_model
    from modelward.robustness.gloro.net import GloroNet

    d = load_data()
    model = build_gloro_model("d(64).d(32)", d.input_shape, d.num_classes)
    cpu = certify(GloroNet(model, d.input_shape, 0.3), d.x_test[:200], d.y_test[:200])
    net = GloroNet(model, d.input_shape, 0.3).cuda()
    gpu = certify(net, d.x_test[:200].cuda(), d.y_test[:200].cuda())
    assert gpu.certified.device.type == "cuda"
    assert abs(gpu.vra - cpu.vra) <= 0.01
