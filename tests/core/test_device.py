import pytest
import torch
from pydantic import ValidationError
from torch import nn

from modelward.core.config import StrictModel
from modelward.core.device import DeviceSetting, autocast, check_device_spec, model_device, resolve_device
from modelward.core.train import TrainConfig, train
from modelward.errors import ConfigError


def test_resolve_device() -> None:
    assert resolve_device() == torch.device("cpu")
    assert resolve_device(torch.device("cpu")) == torch.device("cpu")
    auto = resolve_device("auto")
    assert auto.type == ("cuda" if torch.cuda.is_available() else auto.type)
    with pytest.raises(ConfigError, match="valid choices"):
        resolve_device("tpu")
    if not torch.cuda.is_available():
        with pytest.raises(ConfigError, match="no CUDA GPU"):
            resolve_device("cuda:0")
    else:
        with pytest.raises(ConfigError, match="CUDA device"):
            resolve_device(f"cuda:{torch.cuda.device_count()}")




class _Cfg(StrictModel):
    device: DeviceSetting = "cpu"


def test_device_setting_checks_syntax_not_availability() -> None:
    # a config written for a GPU machine loads anywhere; resolve_device refuses it where the work starts
    for ok in ("auto", "cpu", "cuda", "cuda:3", "mps", "CUDA:1"):
        assert _Cfg(device=ok).device == ok.lower()
    with pytest.raises(ValidationError, match="valid choices"):
        _Cfg(device="gpu")
    assert check_device_spec(" cpu ") == "cpu"
    assert resolve_device("auto").type in ("cpu", "cuda", "mps")
    if not torch.cuda.is_available():
        with pytest.raises(ConfigError, match="no CUDA GPU"):
            resolve_device("cuda")


def test_model_device_and_autocast() -> None:
    assert model_device(nn.ReLU()) == torch.device("cpu")
    assert model_device(nn.Linear(2, 2).to("meta")).type == "meta"
    with autocast("cpu", "none"):
        assert nn.Linear(4, 4)(torch.randn(2, 4)).dtype == torch.float32
    with autocast("cpu", "bf16"):
        assert nn.Linear(4, 4)(torch.randn(2, 4)).dtype == torch.bfloat16
    with pytest.raises(ConfigError, match="amp"), autocast("cpu", "fp8"):
        pass


def test_amp_default_is_left_out_of_the_dump() -> None:
    # studies fingerprinted before `amp` existed keep their fingerprint; bf16 is part of it
    assert "amp" not in TrainConfig().model_dump()
    assert TrainConfig(amp="bf16").model_dump()["amp"] == "bf16"
    assert TrainConfig.model_validate(TrainConfig(amp="bf16").model_dump()).amp == "bf16"


def test_bf16_training_learns_and_full_precision_is_unchanged() -> None:
    g = torch.Generator().manual_seed(0)
    x = torch.randn(256, 8, generator=g)
    y = (x[:, 0] > 0).long()

    def run(amp: str) -> list[tuple[int, float]]:
        torch.manual_seed(0)
        model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 2))
        cfg = TrainConfig(steps=60, eval_every=30, batch_size=32, lr=0.1, amp=amp, loss="cross_entropy")
        return train(model, x, y, x, y, cfg, seed=0).curve

    full, bf16 = run("none"), run("bf16")
    assert full == run("none")  # the default path is deterministic and untouched by autocast
    assert bf16[-1][1] < 0.5 * bf16[0][1]  # bf16 steps still learn
    assert bf16 != full  # and really ran in lower precision


def test_gloro_bound_and_training_step_allocate_on_the_model_device() -> None:
    from modelward.robustness.gloro.layers import build_gloro_model
    from modelward.robustness.gloro.losses import gloro_trades_loss
    from modelward.robustness.gloro.net import GloroNet

    # conv + dense (pooling and constants: the next test)
    model = build_gloro_model("c(4,3,1).d(16)", (1, 8, 8), 10)
    net = GloroNet(model, (1, 8, 8), 0.3).to("meta")
    assert {t.device.type for t in (*net.parameters(), *net.buffers())} == {"meta"}
    K = net.margin_lipschitz(2)
    x = torch.randn(5, 1, 8, 8, device="meta")
    y = torch.zeros(5, dtype=torch.long, device="meta")
    logits = net.f(x)
    gl = torch.cat([logits, net.bottom(logits, K)[:, None]], 1)
    gloro_trades_loss(logits, gl, y, 1.5, "kl").backward()
    assert K.device.type == "meta" and all(p.grad.device.type == "meta" for p in net.f.parameters())


def test_lipschitz_bound_of_parameter_free_layers_follows_the_model() -> None:
    from modelward.robustness.gloro.lipschitz import LipschitzBound

    layers = [("pool", nn.AvgPool2d(2)), ("act", nn.ReLU()), ("flat", nn.Flatten()), ("fc", nn.Linear(16, 8))]
    bound = LipschitzBound(layers, (1, 8, 8)).to("meta")
    from modelward.robustness.gloro.lipschitz import _Bound

    # every layer's bound (constants of ReLU/Flatten too, not only power iterates) lives on the model's device
    assert {m.value(1).device.type for m in bound.modules() if isinstance(m, _Bound)} == {"meta"}
    assert bound(3).device.type == "meta"  # the autograd adjoint of pooling builds its zeros on the device
    cpu = LipschitzBound(layers, (1, 8, 8))
    assert float(cpu(0).detach()) > 0
