"""One `build_defense` from a config section; defenses declare `fast`, `needs` and their incremental state."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
from torch import nn

from modelward.errors import ConfigError
from modelward.extraction.defenses import (
    DEFENSES,
    IncrementalState,
    build_defense,
    defense_class,
    make_defense,
)


def test_needed_models_come_from_factories_called_only_when_needed() -> None:
    calls: list[str] = []

    def surrogate() -> nn.Module:
        calls.append("surrogate")
        return nn.Sequential(nn.Flatten(), nn.Linear(4, 3))

    models = {"surrogate": surrogate, "misinformation": lambda: calls.append("mis")}
    mad = build_defense(SimpleNamespace(name="mad", params={"epsilon": 0.5}), models, epsilon=0.25)
    assert mad.name == "mad" and mad.epsilon == 0.25 and calls == ["surrogate"]
    build_defense(SimpleNamespace(name="rounding", params={}), models)
    assert calls == ["surrogate"]  # a defense that needs no model never builds one


def test_a_needed_model_that_is_not_supplied_is_a_config_error() -> None:
    with pytest.raises(ConfigError, match="misinformation"):
        build_defense(SimpleNamespace(name="adaptive_misinformation", params={}), {})


def test_every_defense_declares_fast_and_needs_and_only_modelguard_s_is_incremental() -> None:
    slow = {"modelguard_w", "mad", "adaptive_misinformation"}
    for name in DEFENSES.names():
        cls = defense_class(name)
        assert cls.fast == (name not in slow), name
        assert cls.needs == {"mad": ("surrogate",), "adaptive_misinformation": ("misinformation",)}.get(name, ())
    s = make_defense("modelguard_s", epsilon=1.0)
    assert isinstance(s, IncrementalState) and not isinstance(make_defense("modelguard_w"), IncrementalState)
    s.defend(torch.tensor([[0.7, 0.2, 0.1]]))
    labels, vecs = s.centroids_since(0)
    fresh = make_defense("modelguard_s", epsilon=1.0)
    fresh.extend_centroids(labels, vecs)
    assert fresh.num_centroids == s.num_centroids == 1
