"""Zoo sizing, App. B parameter counts, part resolution, resets and init schemes."""

from __future__ import annotations

import math

import pytest
import torch

from modelward.core.init import init_weight_


@pytest.mark.parametrize("scheme,expected_std", [
    ("glorot_uniform", math.sqrt(2 / (200 + 300))), ("glorot_normal", math.sqrt(2 / (200 + 300))),
    ("msra", math.sqrt(2 / 300)), ("caffe", math.sqrt(1 / 300))])
def test_init_scheme_variances(scheme, expected_std):
    w = torch.empty(200, 300)
    init_weight_(w, scheme, torch.Generator().manual_seed(0))
    assert abs(w.std().item() - expected_std) / expected_std < 0.03
