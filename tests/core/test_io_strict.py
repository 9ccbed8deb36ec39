"""Checkpoints load only as written: no silent dtype casts, no NaN/Inf weights, damaged metadata named."""

from __future__ import annotations

import struct

import pytest
import torch

from modelward.core.io import check_state, load_state_dict, load_weights, save_state_dict, save_tensors
from modelward.errors import DataError


def _net() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.BatchNorm1d(3), torch.nn.Linear(3, 10))


def test_a_bool_checkpoint_is_refused_with_both_dtypes(tmp_path):
    """The issue's case: a BOOL checkpoint was cast to 0/1 floats and answered one class for everything."""
    net = _net()
    state = {k: (v > 0) if v.is_floating_point() else v for k, v in net.state_dict().items()}
    save_state_dict(tmp_path / "m.safetensors", state)
    with pytest.raises(DataError) as e:
        load_weights(_net(), tmp_path / "m.safetensors")
    assert "torch.bool" in str(e.value) and "torch.float32" in str(e.value) and "m.safetensors" in str(e.value)
    half = {k: v.half() if v.is_floating_point() else v for k, v in net.state_dict().items()}
    with pytest.raises(DataError, match="float16.*expects torch.float32"):
        check_state(_net(), half, "x")
    save_state_dict(tmp_path / "ok.safetensors", net.state_dict(), {"epoch": 3})  # the right dtypes load
    other = _net()
    assert load_weights(other, tmp_path / "ok.safetensors") == {"epoch": 3}
    assert all(torch.equal(a, b) for a, b in zip(other.state_dict().values(), net.state_dict().values(),
                                                 strict=True))


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), -float("inf")])
def test_non_finite_weights_are_refused_at_load(tmp_path, bad):
    net = _net()
    state = net.state_dict()
    state["2.weight"][0, 0] = bad
    save_state_dict(tmp_path / "m.safetensors", state)
    with pytest.raises(DataError, match=r"non-finite weights in 1 tensor\(s\): '2.weight' \([01] NaN, [01] inf of 30 values\)"):
        load_weights(_net(), tmp_path / "m.safetensors")


def test_malformed_metadata_json_is_a_clear_error(tmp_path):
    save_tensors(tmp_path / "m.safetensors", {"w": torch.ones(2)}, {"modelward": "{not json"})
    with pytest.raises(DataError, match="metadata is not valid JSON"):
        load_state_dict(tmp_path / "m.safetensors")
    save_tensors(tmp_path / "l.safetensors", {"w": torch.ones(2)}, {"modelward": "[1, 2]"})
    with pytest.raises(DataError, match="not a JSON object"):
        load_state_dict(tmp_path / "l.safetensors")
    # a header that is not JSON at all (a damaged file) is named too, not a traceback
    head = b"{bad header}    "
    (tmp_path / "h.safetensors").write_bytes(struct.pack("<Q", len(head)) + head)
    with pytest.raises(DataError, match="h.safetensors: not a valid safetensors file"):
        load_state_dict(tmp_path / "h.safetensors")
