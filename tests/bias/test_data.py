"""Local data files for the bias study (scikit-feature .mat) and the study's run functions."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from modelward.bias.data import binarize, load_arrays, load_mat
from modelward.bias.study import DatasetSpec, run_dataset_split
from modelward.errors import DataError


def test_load_mat_and_errors(tmp_path: Path) -> None:
    from scipy.io import savemat

    savemat(tmp_path / "ok.mat", {"X": np.arange(12.0).reshape(4, 3), "Y": np.array([[1], [2], [2], [2]])})
    x, y = load_mat(tmp_path / "ok.mat")
    assert x.shape == (4, 3) and list(y) == [1, 2, 2, 2]
    savemat(tmp_path / "bad.mat", {"data": np.zeros((2, 2))})
    with pytest.raises(DataError, match="missing variable"):
        load_mat(tmp_path / "bad.mat")
    (tmp_path / "junk.mat").write_bytes(b"not a mat file")
    with pytest.raises(DataError, match="not a readable"):
        load_mat(tmp_path / "junk.mat")
    with pytest.raises(DataError, match="not found"):
        load_mat(tmp_path / "none.mat")


def test_binarize() -> None:
    yb, keep = binarize(np.array([1, 2, 2, 2]))
    assert list(yb) == [0, 1, 1, 1] and keep.all()
    yb, keep = binarize(np.array([3, 8, 1, 8]), (3, 8))
    assert list(yb) == [0, 1, 1] and list(keep) == [True, True, False, True]
    with pytest.raises(DataError, match="classes"):
        binarize(np.array([0, 1, 2]))


def test_csv_source_through_core_data(tmp_path: Path) -> None:
    rows = ["a,b,label"] + [f"{i},{i % 3},{'yes' if i % 4 else 'no'}" for i in range(20)]
    (tmp_path / "d.csv").write_text("\n".join(rows) + "\n")
    from modelward.core.data import DataConfig

    x, y, name = load_arrays(DataConfig(source="csv", path=str(tmp_path / "d.csv"), label_column="label"))
    assert x.shape == (20, 2) and name == "d.csv"
    ds = DatasetSpec(name="d", data=DataConfig(source="csv", path=str(tmp_path / "d.csv"), label_column="label"),
                     splits=1, mitigations=["parity", "experts"])
    res = run_dataset_split(ds, 0)
    assert res["p"] == pytest.approx(0.75) and {"none", "parity", "experts"} <= set(res)
