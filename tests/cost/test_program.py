"""Lowering to affine/x² programs: exact on the cost models, a clear error naming the layer otherwise."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch import nn

from modelward.core.init import init_model_
from modelward.core.zoo import ModelConfig, build_model
from modelward.cost.he import HEConfig, choose_params
from modelward.cost.models import Square, square_cnn, square_mlp
from modelward.cost.program import UnsupportedLayer, lower
from modelward.cost.result import PrecisionError, check_agreement
from modelward.errors import ConfigError


@pytest.mark.parametrize("make,shape", [(lambda: square_mlp((1, 8, 8), 10, [16, 8]), (1, 8, 8)),
                                        (lambda: square_cnn((1, 8, 8), 10), (1, 8, 8)),
                                        (lambda: square_mlp((30,), 2, []), (30,))])
def test_lowered_program_matches_model(make, shape) -> None:
    model = init_model_(make(), "glorot_uniform", 0).eval()
    prog = lower(model, shape)
    x = torch.randn(5, *shape, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        ref = model(x).double().numpy()
    assert np.abs(prog.run(x.double().numpy()) - ref).max() < 1e-5 * (1 + np.abs(ref).max())  # float32 model
    assert prog.ops[-1].kind == "affine" and prog.out_features == ref.shape[1]
    kinds = [op.kind for op in prog.ops]
    assert kinds.count("square") == sum(isinstance(m, Square) for m in model.modules())


def test_relu_and_maxpool_are_named_in_the_error() -> None:
    mlp = build_model(ModelConfig(arch="mlp", hidden=[8]), (1, 8, 8), 10).eval()
    with pytest.raises(UnsupportedLayer, match=r"backend he cannot run layer 'relu' \(torch relu after 'fc1'\)"):
        lower(mlp, (1, 8, 8), backend="he")
    cnn = build_model(ModelConfig(arch="cnn", channels=[4], fc=8, batch_norm=False), (1, 8, 8), 10).eval()
    with pytest.raises(UnsupportedLayer, match=r"backend mpc cannot run layer 'conv1.0.act' \(ReLU\)"):
        lower(cnn, (1, 8, 8), backend="mpc")


class _Residual(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(4, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.fc(x)


def test_residual_connection_is_refused() -> None:
    with pytest.raises(UnsupportedLayer, match="combines several tensors"):
        lower(_Residual(), (4,), backend="he")


def test_he_parameters_are_128_bit_and_deep_enough() -> None:
    shallow = lower(square_mlp((30,), 2, [8]).eval(), (30,))
    n, bits = choose_params(shallow, HEConfig(scale_bits=30, int_bits=20))
    assert (n, sum(bits), len(bits)) == (8192, 190, 5)  # depth 3 fits N=8192 (≤ 218 bits at 128-bit security)
    deep = lower(square_mlp((64,), 10, [16, 16]).eval(), (64,))
    assert choose_params(deep, HEConfig(scale_bits=30, int_bits=20))[0] == 16384
    assert choose_params(shallow, HEConfig()) == (8192, [55, 35, 35, 35, 55])  # auto: largest scale N=8192 allows
    assert choose_params(deep, HEConfig()) == (16384, [60, 40, 40, 40, 40, 40, 60])
    with pytest.raises(ConfigError, match="128-bit security allows 218 bits"):
        choose_params(deep, HEConfig(poly_modulus_degree=8192))


def test_agreement_check_fails_loudly() -> None:
    ref = np.zeros((2, 3))
    assert check_agreement("he", ref + 1e-4, ref, 1e-3, "x") == pytest.approx(1e-4)
    with pytest.raises(PrecisionError, match="drift from plaintext by 0.5 > stated precision"):
        check_agreement("he", ref + np.array([[0, 0, 0.5], [0, 0, 0]]), ref, 1e-3, "CKKS")
    with pytest.raises(PrecisionError, match="non-finite"):
        check_agreement("mpc", ref + np.inf, ref, 1e-3, "fxp")


def test_reference_sgd_step_matches_torch_autograd() -> None:
    model = init_model_(square_mlp((6,), 3, [5]), "glorot_uniform", 0).double()
    prog = lower(model, (6,))
    g = torch.Generator().manual_seed(0)
    x, t = torch.randn(4, 6, generator=g, dtype=torch.float64), torch.eye(3, dtype=torch.float64)[[0, 2, 1, 2]]
    new = prog.sgd_mse_step(x.numpy(), t.numpy(), 0.1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    (0.5 * ((model(x) - t) ** 2).sum(1).mean()).backward()
    opt.step()
    assert np.allclose(new[0][0], model.fc1.weight.detach().numpy()) and np.allclose(new[2][1], model.logits.bias.detach().numpy())
    assert all(op.dense for op in prog.ops if op.kind == "affine")
    assert not any(op.dense for op in lower(square_cnn((1, 8, 8), 10), (1, 8, 8)).ops[:1])
