import pytest
import torch

from modelward.core.init import init_model_
from modelward.core.zoo import ModelConfig, build_model
from modelward.governance.plan import (
    PlanError,
    Segment,
    infer_model_config,
    make_plan,
    model_layers,
    segment_of,
)


@pytest.mark.parametrize("cfg,shape", [
    (ModelConfig(arch="mlp", hidden=[16, 8]), (1, 8, 8)),
    (ModelConfig(arch="cnn", channels=[4, 8], fc=16), (1, 8, 8)),
    (ModelConfig(arch="alexnet", width=0.05), (3, 16, 16)),
    (ModelConfig(arch="resnet", sections=[1, 1], base_channels=4), (3, 8, 8)),
])
def test_layers_in_order_reproduce_the_model(cfg, shape):
    model = init_model_(build_model(cfg, shape, 5), seed=1).eval()
    x = torch.randn(3, *shape)
    layers = model_layers(model)
    plan = make_plan(model, ["alice", "bob", "carol"], [layers[0].name, layers[-2].name])
    h = x
    for party in plan.parties:
        h = segment_of(model, plan.owners[party])(h)
    # bit for bit by design: the segments run the model's own modules, the same ops on the same shapes in one
    # process (split vs monolithic on one machine)
    torch.testing.assert_close(h, model(x), rtol=0, atol=0)
    seg_names = {n for p in plan.parties for n, _ in segment_of(model, plan.owners[p]).named_parameters()}
    assert seg_names == {n for n, _ in model.named_parameters()}  # disjoint cover, same names


def test_bad_plans_are_explained():
    model = build_model(ModelConfig(arch="cnn", channels=[4, 8], fc=16), (1, 8, 8), 5)
    with pytest.raises(PlanError, match="valid cut points"):
        make_plan(model, ["alice", "bob"], ["conv9"])
    with pytest.raises(PlanError, match="at least 2 parties"):
        make_plan(model, ["alice"], [])
    with pytest.raises(PlanError, match="not contiguous"):
        segment_of(model, ["conv1", "fc1"])
    with pytest.raises(PlanError, match="cannot split"):
        model_layers(torch.nn.LSTM(3, 3))


def test_segment_holds_only_its_parameters():
    model = build_model(ModelConfig(arch="mlp", hidden=[16]), (1, 8, 8), 5)
    seg = segment_of(model, ["logits"])
    assert isinstance(seg, Segment) and {n for n, _ in seg.named_parameters()} == {"logits.weight", "logits.bias"}


def test_infer_model_config_rebuilds_zoo_models():
    for cfg in (ModelConfig(arch="mlp", hidden=[16, 8]), ModelConfig(arch="cnn", channels=[4, 8], fc=16,
                                                                      batch_norm=False)):
        m = build_model(cfg, (1, 8, 8), 10)
        m2 = build_model(infer_model_config(m), (1, 8, 8), 10)
        m2.load_state_dict(m.state_dict())  # strict: same structure
