"""Findings' intervals agree with scipy.stats' reference implementations; mappings cover every finding kind."""

from __future__ import annotations

import pytest

from modelward.assess.findings import MAPPINGS, SECTION_MAPPING, Metric, clopper_pearson, t_interval


@pytest.mark.parametrize(("k", "n"), [(0, 10), (3, 10), (10, 10), (57, 200), (199, 200), (1, 1000)])
def test_clopper_pearson_matches_scipy_binomtest(k: int, n: int) -> None:
    from scipy.stats import binomtest

    ref = binomtest(k, n).proportion_ci(confidence_level=0.95, method="exact")
    lo, hi = clopper_pearson(k, n)
    assert lo == pytest.approx(ref.low, abs=1e-9) and hi == pytest.approx(ref.high, abs=1e-9)


def test_t_interval_matches_scipy() -> None:
    from scipy import stats

    v = [0.61, 0.7, 0.66, 0.58]
    ref = stats.t.interval(0.95, len(v) - 1, loc=sum(v) / len(v), scale=stats.sem(v))
    assert t_interval(v) == pytest.approx(ref)


def test_every_mapping_has_owasp_atlas_and_nist_ids() -> None:
    assert set(SECTION_MAPPING.values()) <= set(MAPPINGS)
    for kind, m in MAPPINGS.items():
        assert m["owasp"] and all(i.startswith("ML") and ":2023" in i for i in m["owasp"]), kind
        assert m["atlas"] and all(i.startswith("AML.T") for i in m["atlas"]), kind
        assert m["nist"], kind


def test_a_metric_without_samples_has_no_interval() -> None:
    assert Metric("x", "x", 0.5, risk_up=True).interval() is None
    assert Metric("x", "x", 0.5, seeds=[0.4, 0.6], risk_up=True).interval() is not None


def test_certify_refuses_a_plain_module_with_a_clear_error() -> None:
    import torch

    from modelward.errors import ConfigError
    from modelward.robustness.gloro.certify import certify

    with pytest.raises(ConfigError, match="expected a GloroNet, got Sequential"):
        certify(torch.nn.Sequential(torch.nn.Linear(4, 2)), torch.rand(3, 4))  # type: ignore[arg-type]


def test_quality_warning_near_chance_and_below_the_record() -> None:
    import torch

    from modelward.assess.target import Target, quality_warning
    from modelward.core.data import DataConfig, load_data

    data = load_data(DataConfig(source="breast_cancer"))
    torch.manual_seed(0)
    good = torch.nn.Linear(data.x_train.shape[1], 2)
    opt = torch.optim.Adam(good.parameters(), lr=0.05)
    for _ in range(150):
        opt.zero_grad()
        torch.nn.functional.cross_entropy(good(data.x_train), data.y_train).backward()
        opt.step()
    target = Target(good.eval(), data, lambda: good, None, None, "entrypoint", "linear", record={"test_accuracy": 0.95})
    acc, warning = quality_warning(target)
    assert acc > 0.9 and warning is None
    # the same model fed unstandardised features (a preprocessing mismatch): refused a verdict
    raw = load_data(DataConfig(source="breast_cancer", standardize=False))
    target = Target(good, raw, lambda: good, None, None, "entrypoint", "linear", record={"test_accuracy": acc})
    acc_raw, warning = quality_warning(target, expected_accuracy=acc)
    assert acc_raw < acc - 0.10 and warning is not None and "no verdict" in warning
    assert "recorded" in warning and "expected" in warning
