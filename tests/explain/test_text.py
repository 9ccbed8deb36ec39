"""Token attributions (explain/text.py): integrated gradients at the embedding layer equal Captum's
LayerIntegratedGradients on the word embeddings, and add up to the change of the class score along the path."""

from __future__ import annotations

import pytest
import torch

from modelward.core.text import embedding_delta
from modelward.core.zoo import ModelConfig, build_model
from modelward.explain.text import token_attributions

pytest.importorskip("transformers", reason="the text extra (transformers) is not installed")
captum = pytest.importorskip("captum.attr", reason="captum (the test extra) is not installed")

TINY_BERT = {"model_type": "bert", "vocab_size": 40, "hidden_size": 16, "num_hidden_layers": 2,
             "num_attention_heads": 2, "intermediate_size": 32, "max_position_embeddings": 32}


def test_token_attributions_equal_captum_and_are_complete():
    torch.manual_seed(0)
    net = build_model(ModelConfig(source="hf", kwargs=TINY_BERT), (9,), 3).eval()
    ids = torch.tensor([[2, 5, 17, 8, 3, 0, 0, 0, 0], [2, 30, 4, 9, 11, 6, 3, 0, 0]])
    target = torch.tensor([1, 2])
    special = (0, 2, 3)
    ours = token_attributions(net, ids, target, special, pad_id=0, steps=48)
    base = torch.where(torch.isin(ids, torch.tensor(special)), ids, torch.zeros_like(ids))
    lig = captum.LayerIntegratedGradients(net, net.token_embedding())
    ref = lig.attribute(ids, baselines=base, target=target, n_steps=48, method="riemann_middle").sum(-1)
    # the same Riemann sum over the same float32 gradients; Captum batches the 48 steps in one pass (other kernels)
    torch.testing.assert_close(ours, ref, rtol=1e-4, atol=1e-5)
    assert (ours[torch.isin(ids, torch.tensor(special))] == 0).all()
    # completeness: the attributions sum to f(x) − f(path start) (padding embeddings at the real tokens' places)
    table = net.token_embedding().weight.detach()
    with torch.no_grad(), embedding_delta(net, table[base] - table[ids]):
        start = net(ids).gather(1, target.view(-1, 1)).squeeze(1)
    with torch.no_grad():
        end = net(ids).gather(1, target.view(-1, 1)).squeeze(1)
    torch.testing.assert_close(ours.sum(1), end - start, rtol=0.05, atol=0.02)  # Riemann error of 48 steps
