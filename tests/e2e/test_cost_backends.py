"""Each available backend on 4 breast_cancer samples agrees with plain PyTorch to its stated precision.

The backends run for real: TenSEAL CKKS with 128-bit parameters, MPyC with 3 party processes on 127.0.0.1,
and the governance split path with 2 gRPC + mutual-TLS party processes. A backend whose library is missing is
skipped with the reason.
"""

from __future__ import annotations

import importlib.util

import numpy as np
import pytest
import torch

from modelward.core.data import DataConfig, load_data
from modelward.core.init import init_model_
from modelward.core.zoo import ModelConfig, build_model
from modelward.cost.he import HEConfig, run_he
from modelward.cost.mpc import MPCConfig, run_mpc
from modelward.cost.program import lower
from modelward.cost.result import PrecisionError, check_agreement

MODEL_CFG = ModelConfig(arch="entrypoint", entrypoint="modelward.cost.models:square_mlp", kwargs={"hidden": [4]})


def _need(module: str) -> None:
    if importlib.util.find_spec(module) is None:
        pytest.skip(f"{module} is not installed (pip install 'modelward[cost]'); backend not tested")


@pytest.fixture(scope="module")
def setup():
    data = load_data(DataConfig(source="breast_cancer", test_fraction=0.25, seed=0))
    model = init_model_(build_model(MODEL_CFG, data.input_shape, data.num_classes), "glorot_uniform", 0).eval()
    with torch.no_grad():  # visible biases: TenSEAL's plaintext-bias bug (#462) only shows when b ≠ 0
        model.fc1.bias.fill_(1.0)
    x = data.x_test[:4].float()
    with torch.no_grad():
        ref = model(x).double().numpy()
    return data, model, x, ref


def _agree(res, ref) -> float:
    assert res.status == "ok", res.reason
    tol = res.extra["tol_scale"] * (1 + np.abs(ref).max())
    return check_agreement(res.backend, res.outputs, ref, tol, res.precision)


def test_he_ckks_agrees_with_plain_and_catches_the_bias_bug(setup) -> None:
    _need("tenseal")
    from modelward.cost.he import CKKSInference

    data, model, x, ref = setup
    prog = lower(model, data.input_shape, "he")
    engine = CKKSInference(prog, HEConfig())
    res = run_he(prog, x.double().numpy(), HEConfig(), engine=engine)
    diff = _agree(res, ref)
    assert 0 < diff  # CKKS is approximate: an exact match would mean the plaintext leaked into the result
    assert "N=8192" in res.params and "128-bit" in res.params
    assert res.bytes_per_sample > 2 * 8192  # two serialized ciphertexts of 8192 coefficients per sample
    assert res.setup_bytes > res.bytes_per_sample  # the evaluation keys dwarf one ciphertext
    # TenSEAL #462: a plaintext bias added before the next mm breaks the slot layout; the check must catch it
    engine.cfg = HEConfig(bias="plain")
    bad = run_he(prog, x[:1].double().numpy(), HEConfig(bias="plain"), engine=engine)
    with pytest.raises(PrecisionError, match="drift from plaintext"):
        _agree(bad, ref[:1])


def test_mpc_three_processes_agree_with_plain(setup, tmp_path) -> None:
    _need("mpyc")
    data, model, x, ref = setup
    prog = lower(model, data.input_shape, "mpc")
    xt, tt = data.x_train[:4].double().numpy(), np.eye(2)[data.y_train[:4].numpy()]
    cfg = MPCConfig(repeats=1, timeout_s=120, train_lr=0.1)
    res = run_mpc(prog, x.double().numpy(), cfg, tmp_path, train=(xt, tt))
    _agree(res, ref)
    assert res.bytes_per_sample > 0 and res.setup_bytes > 0
    # one secret-shared SGD step lands on the plain step's weights (to fixed-point precision), and it moved them
    new, step = res.extra["train"]["weights"], prog.sgd_mse_step(xt, tt, 0.1)
    for i, (w, b) in step.items():
        assert np.abs(new[f"op{i}.weight"] - w).max() < 2.0 ** -8 and np.abs(new[f"op{i}.bias"] - b).max() < 2.0 ** -8
        assert np.abs(w - prog.ops[i].weight).max() > 1e-3
    assert sorted(p.name for p in tmp_path.glob("stats_*.json")) == ["stats_0.json", "stats_1.json", "stats_2.json"]


def test_split_agrees_and_trains_like_plain(setup, tmp_path) -> None:
    from modelward.cost.split import run_split

    data, model, x, ref = setup
    tb = (data.x_train[:8], data.y_train[:8])
    res, training = run_split(model, MODEL_CFG, data.input_shape, data.num_classes, x, 1, None, tb, None, 1,
                              tmp_path)
    assert _agree(res, ref) <= 1e-5 * (1 + np.abs(ref).max())
    assert res.bytes_per_sample > 0
    # float32 (parameters of order 1, one step: the kernels' rounding is far below this)
    assert training is not None and training["param_max_abs_diff"] < 1e-5 * (1 + training["param_scale"])
    assert training["split_bytes_per_sample"] > 0
