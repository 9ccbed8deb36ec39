"""Training procedure T (curve semantics, T2 freezing), the run ledger, safetensors io."""

from __future__ import annotations

import torch

from modelward.core.data import load_data
from modelward.core.io import load_state_dict, optimizer_from_tensors, optimizer_to_tensors, save_state_dict
from modelward.core.zoo import ModelConfig, build_model


def _setup():
    d = load_data()
    torch.manual_seed(0)
    m = build_model(ModelConfig(arch="cnn", channels=[4, 8], fc=16), d.input_shape, d.num_classes)
    return d, m


def test_safetensors_roundtrip_model_and_optimizer(tmp_path):
    d, m = _setup()
    opt = torch.optim.SGD(m.parameters(), lr=0.1, momentum=0.9)
    m(d.x_train[:8]).sum().backward()
    opt.step()
    t, skel = optimizer_to_tensors(opt)
    save_state_dict(tmp_path / "m.safetensors", {**m.state_dict(), **t}, {"opt": skel})
    tensors, meta = load_state_dict(tmp_path / "m.safetensors")
    opt2 = torch.optim.SGD(m.parameters(), lr=0.5, momentum=0.9)
    optimizer_from_tensors(opt2, tensors, meta["opt"])
    assert opt2.param_groups[0]["lr"] == 0.1
    k = next(iter(opt.state_dict()["state"]))
    assert torch.equal(opt2.state_dict()["state"][k]["momentum_buffer"], opt.state_dict()["state"][k]["momentum_buffer"])
