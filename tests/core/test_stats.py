import dataclasses
import math

import pytest

from modelward.core.stats import Summary, mean_sd_text, summarize


def test_summarize_matches_the_definitions() -> None:
    s = summarize([3.0, 1.0, 2.0, 10.0])
    assert (s.median, s.mean, s.min, s.max, s.n) == (2.5, 4.0, 1.0, 10.0, 4)
    assert s.sd == pytest.approx(math.sqrt(((3 - 4) ** 2 + 9 + 4 + 36) / 3))  # n - 1
    one = summarize([0.7])
    assert one.mean == 0.7 and math.isnan(one.sd)
    none = summarize([])
    assert none.n == 0 and math.isnan(none.mean)
    assert summarize([1.0, None, float("nan"), 3.0], skip_missing=True).mean == 2.0
    assert list(s.as_dict("acc_")) == ["acc_median", "acc_mean", "acc_sd", "acc_min", "acc_max", "acc_n"]
    with pytest.raises(dataclasses.FrozenInstanceError):
        Summary(1, 1, 1, 1, 1, 1).n = 2  # frozen


def test_mean_sd_text() -> None:
    assert mean_sd_text([0.4, 0.5, 0.6]) == "0.50 ± 0.10"
    assert mean_sd_text([0.4]) == "0.40"
    assert mean_sd_text([0.1, 0.2], scale=100, unit="%", sd_digits=1) == "15.00% ± 7.1"
    assert mean_sd_text([]) == "—"
