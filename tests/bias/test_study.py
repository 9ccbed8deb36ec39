"""Local data files for the bias study (scikit-feature .mat) and the study's run functions."""

from __future__ import annotations

import pytest

from modelward.bias.study import BiasConfig, DatasetSpec, SweepSpec, run_sweep_cell
from modelward.errors import ConfigError


def test_config_validation() -> None:
    with pytest.raises(ValueError, match="nothing to do"):
        BiasConfig()
    with pytest.raises(ValueError, match="gaussian_nb"):
        DatasetSpec(name="x", learner="gaussian_nb")
    with pytest.raises(ValueError, match="l1"):
        DatasetSpec(name="x", kind="deep", mitigations=["l1"])
    assert ConfigError  # the CLI turns these into ConfigError (tests/e2e)


def test_sweep_cell_weak_features_make_sgd_biased() -> None:
    spec = SweepSpec(runs=3, test_samples=500, weak_var=10.0)
    none = run_sweep_cell(0, 100, spec, seed=0)
    many = run_sweep_cell(256, 100, spec, seed=0)
    assert many["bias"] > none["bias"] + 0.1  # Fig. 9.3a
    assert none["weak_weight_error"] is None and isinstance(many["weak_weight_error"], float)
    near_strong = run_sweep_cell(256, 100, spec, seed=0, weak_var=1.0)  # Fig. 9.3b: weak must be weak
    assert near_strong["bias"] < many["bias"] - 0.1 and near_strong["weak_var"] == 1.0
