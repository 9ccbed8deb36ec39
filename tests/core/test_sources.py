"""Model sources (core/sources.py): one registry from [model] source to a builder; HF text classifiers built from a
transformers config or a local save_pretrained folder, with their weights; nothing downloaded, no model-folder code
run; torchvision/timm refused with one line where they cannot be had (their builds: tests/core/test_sources_vision.py).
"""

from __future__ import annotations

import json
import os

import pytest
import torch

from modelward.core.sources import SOURCES, adapt_state_dict, hf_weight_files, import_torchvision
from modelward.core.zoo import ModelConfig, build_model
from modelward.errors import ConfigError, DataError

transformers = pytest.importorskip("transformers", reason="the text extra (transformers) is not installed")

TINY_BERT = {"model_type": "bert", "vocab_size": 40, "hidden_size": 16, "num_hidden_layers": 1,
             "num_attention_heads": 2, "intermediate_size": 32, "max_position_embeddings": 32}


def test_one_registry_maps_every_source_to_a_builder():
    assert set(SOURCES.names()) == {"zoo", "entrypoint", "torchvision", "timm", "hf"}
    assert ModelConfig(arch="mlp").resolved_source == "zoo"
    assert ModelConfig(arch="entrypoint", entrypoint="a:b").resolved_source == "entrypoint"
    net = build_model(ModelConfig(arch="mlp", hidden=[4], num_classes=5), (3,), 2)  # more logits than data classes
    assert net(torch.zeros(1, 3)).shape == (1, 5)
    with pytest.raises(ConfigError, match="num_classes = 2, but the data has 3"):
        build_model(ModelConfig(arch="mlp", num_classes=2), (3,), 3)


@pytest.mark.parametrize("fields,match", [
    ({"source": "timm"}, "needs model.name"),
    ({"source": "hf"}, "needs model.path"),
    ({"source": "zoo", "name": "resnet18"}, "read for sources torchvision and timm"),
    ({"source": "timm", "name": "x", "path": "p"}, "read for source 'hf'"),
    ({"source": "entrypoint", "arch": "mlp"}, "goes with model.arch='entrypoint'"),
])
def test_bad_source_fields_are_named(fields, match):
    with pytest.raises(ValueError, match=match):
        ModelConfig(**fields)


def test_unset_source_fields_leave_dumps_and_fingerprints_unchanged():
    assert set(ModelConfig().model_dump()) == {"arch", "width", "hidden", "channels", "fc", "sections",
                                               "base_channels", "batch_norm", "entrypoint", "kwargs"}


def test_hf_classifier_from_a_config_takes_token_ids_and_masks_padding():
    net = build_model(ModelConfig(source="hf", kwargs=TINY_BERT), (8,), 3).eval()
    ids = torch.tensor([[2, 5, 6, 3, 0, 0, 0, 0]])
    with torch.no_grad():
        a = net(ids)
        b = net(torch.tensor([[2, 5, 6, 3, 0, 0, 0, 0, 0, 0]]))  # more padding: same answer (the mask hides it)
    assert a.shape == (1, 3)
    torch.testing.assert_close(a, b, rtol=0, atol=1e-5)  # float32 attention over 8 vs 10 keys: summation order
    with pytest.raises(DataError, match="takes token ids"):
        net(torch.rand(1, 8))


def test_hf_folder_round_trip_and_refusals(tmp_path):
    net = build_model(ModelConfig(source="hf", kwargs=TINY_BERT), (8,), 3).eval()
    net.hf.save_pretrained(tmp_path)  # config.json + model.safetensors, HF's own names
    files = hf_weight_files(tmp_path)
    assert [f.name for f in files] == ["model.safetensors"]
    from safetensors.torch import load_file

    state = adapt_state_dict(net, load_file(files[0]))
    again = build_model(ModelConfig(source="hf", path=str(tmp_path)), (8,), 3).eval()
    again.load_state_dict(state)
    ids = torch.tensor([[2, 7, 9, 3, 0, 0, 0, 0]])
    with torch.no_grad():
        torch.testing.assert_close(again(ids), net(ids), rtol=0, atol=0)  # the same weights, the same kernels
    cfg = json.loads((tmp_path / "config.json").read_text())
    (tmp_path / "config.json").write_text(json.dumps({**cfg, "auto_map": {"AutoModel": "evil.Net"}}))
    with pytest.raises(ConfigError, match="never runs a model folder's code"):
        build_model(ModelConfig(source="hf", path=str(tmp_path)), (8,), 3)
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ConfigError, match="has 3 labels but the data has 4"):
        build_model(ModelConfig(source="hf", path=str(tmp_path)), (8,), 4)
    with pytest.raises(DataError, match="must be a folder with a config.json"):
        build_model(ModelConfig(source="hf", path=str(tmp_path / "nope")), (8,), 3)


def test_the_hub_is_offline_and_images_are_refused():
    build_model(ModelConfig(source="hf", kwargs=TINY_BERT), (8,), 2)
    assert os.environ.get("HF_HUB_OFFLINE") == "1"  # a download attempt would fail, not fetch
    with pytest.raises(ConfigError, match="token ids"):
        build_model(ModelConfig(source="hf", kwargs=TINY_BERT), (3, 8, 8), 2)
    with pytest.raises(ConfigError, match="model_type 'no-such-model'"):
        build_model(ModelConfig(source="hf", kwargs={"model_type": "no-such-model"}), (8,), 2)


def test_without_torchvision_one_line_says_how_to_get_it():
    try:
        import_torchvision()
    except ConfigError as e:
        assert "make vision" in str(e) and "\n" not in str(e)
    else:
        pytest.skip("torchvision imports here: its builds are tested in test_sources_vision.py")
    with pytest.raises(ConfigError, match="torchvision"):
        build_model(ModelConfig(source="torchvision", name="resnet18"), (3, 32, 32), 10)
