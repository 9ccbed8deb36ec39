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


def test_run_bias_is_the_library_entry_point_and_resumes_only_on_execution_settings(tmp_path) -> None:
    from modelward.bias import run_bias
    from modelward.errors import LedgerError

    cfg = BiasConfig(theorem={"cases": [(0.75, 0.5)], "samples": 20_000},
                     sweep={"n_weak": [0], "train_sizes": [100], "runs": 3, "test_samples": 200})
    outcome = run_bias(cfg, tmp_path)
    assert outcome.done == outcome.total == 2 and not outcome.failed
    (t,), (s,) = outcome.tables["theorem"], outcome.tables["sweep"]
    assert abs(t["theorem"] - 0.2382) < 1e-3 and abs(t["z"]) < 4
    assert s["runs"] == 3 and s["bias_sd"] >= 0.0
    assert (tmp_path / "theorem.csv").is_file() and (tmp_path / "config.json").is_file()
    again = run_bias(cfg.model_copy(update={"workers": 2, "device": "auto"}), tmp_path)  # execution settings only
    assert again.tables == outcome.tables
    with pytest.raises(LedgerError, match="different"):
        run_bias(cfg.model_copy(update={"seed": 1}), tmp_path)
