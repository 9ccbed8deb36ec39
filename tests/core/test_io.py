"""Training procedure T (curve semantics, T2 freezing), the run ledger, safetensors io."""

from __future__ import annotations

import pytest
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


def test_write_safetensors_is_read_back_by_safetensors_exactly(tmp_path):
    from safetensors.torch import load as st_load
    from safetensors.torch import save as st_save

    from modelward.core.io import load_metadata, load_tensors, write_safetensors

    g = torch.Generator().manual_seed(0)
    tensors = {
        "w": torch.randn(3, 5, generator=g), "d": torch.randn(4, generator=g, dtype=torch.float64),
        "h": torch.randn(2, 2, generator=g).half(), "bf": torch.randn(7, generator=g).bfloat16(),
        "i": torch.arange(6).reshape(2, 3), "i32": torch.arange(5, dtype=torch.int32),
        "u8": torch.arange(9, dtype=torch.uint8), "flag": torch.tensor([True, False, True]),
        "scalar": torch.tensor(2.5), "empty": torch.empty(0, 3), "odd": torch.arange(3, dtype=torch.int8),
    }
    write_safetensors(tmp_path / "x.safetensors", tensors, {"modelward": '{"step": 3}'})
    back = load_tensors(tmp_path / "x.safetensors")
    assert back.keys() == tensors.keys()
    for k, v in tensors.items():
        assert back[k].dtype == v.dtype and back[k].shape == v.shape and torch.equal(back[k], v), k
    assert load_metadata(tmp_path / "x.safetensors") == {"modelward": '{"step": 3}'}
    # the library's own writer gives the same tensors
    ref = st_load(st_save(tensors, metadata={"modelward": '{"step": 3}'}))
    assert all(torch.equal(ref[k], back[k]) for k in tensors)
    with pytest.raises(ValueError, match="contiguous CPU tensor"):
        write_safetensors(tmp_path / "y.safetensors", {"t": torch.randn(3, 4).t()})
