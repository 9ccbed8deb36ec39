"""Each data source on small files the test writes; clear errors for missing/malformed files."""

from __future__ import annotations

import gzip
import struct

import numpy as np
import pytest
import torch
from PIL import Image

from modelward.core.config import validate
from modelward.core.data import DataConfig, load_data, read_idx
from modelward.errors import ConfigError, DataError


def test_digits_default_is_images_in_unit_box_and_deterministic():
    a = load_data()
    b = load_data(DataConfig(seed=0))
    assert a.input_shape == (1, 8, 8) and a.num_classes == 10
    assert 0.0 <= a.x_train.min() and a.x_train.max() <= 1.0
    assert torch.equal(a.x_train, b.x_train) and torch.equal(a.y_test, b.y_test)
    c = load_data(DataConfig(seed=1))
    assert not torch.equal(a.y_train, c.y_train)


@pytest.mark.parametrize("source,classes", [("breast_cancer", 2), ("wine", 3), ("iris", 3)])
def test_bundled_tabular_standardized(source, classes):
    d = load_data(DataConfig(source=source))
    assert d.num_classes == classes and d.x_train.dim() == 2
    assert d.x_train.mean(0).abs().max() < 1e-4


def test_synthetic_generators():
    im = load_data(DataConfig(source="synthetic_images", n_samples=200, num_classes=5, image_size=12, channels=3))
    assert im.input_shape == (3, 12, 12) and im.num_classes == 5
    tab = load_data(DataConfig(source="synthetic_tabular", n_samples=200, n_features=7, num_classes=3))
    assert tab.input_shape == (7,) and len(tab.x_train) + len(tab.x_test) == 200


def test_npz_nhwc_uint8_and_separate_test(tmp_path):
    rng = np.random.default_rng(0)
    x = rng.integers(0, 256, (40, 6, 6, 3), dtype=np.uint8)
    y = np.arange(40) % 4
    np.savez(tmp_path / "train.npz", x=x, y=y)
    np.savez(tmp_path / "test.npz", x=x[:8], y=y[:8])
    d = load_data(DataConfig(source="npz", path=str(tmp_path / "train.npz"), test_path=str(tmp_path / "test.npz")))
    assert d.input_shape == (3, 6, 6) and len(d.x_test) == 8 and d.x_train.max() <= 1.0


def test_npz_errors_name_the_file(tmp_path):
    np.savez(tmp_path / "bad.npz", x=np.zeros((3, 2)))
    with pytest.raises(DataError, match=r"bad.npz.*'y'"):
        load_data(DataConfig(source="npz", path=str(tmp_path / "bad.npz")))
    (tmp_path / "junk.npz").write_bytes(b"not a zip")
    with pytest.raises(DataError, match="junk.npz"):
        load_data(DataConfig(source="npz", path=str(tmp_path / "junk.npz")))
    with pytest.raises(DataError, match="missing.npz: npz file not found"):
        load_data(DataConfig(source="npz", path=str(tmp_path / "missing.npz")))
    np.savez(tmp_path / "obj.npz", x=np.array([{"a": 1}] * 4, dtype=object), y=np.zeros(4))
    with pytest.raises(DataError, match="unpickling"):
        load_data(DataConfig(source="npz", path=str(tmp_path / "obj.npz")))


def test_csv_with_string_labels_and_errors(tmp_path):
    rows = ["a,b,species"] + [f"{i},{i * 2},{'cat' if i % 2 else 'dog'}" for i in range(20)]
    (tmp_path / "t.csv").write_text("\n".join(rows))
    d = load_data(DataConfig(source="csv", path=str(tmp_path / "t.csv"), label_column="species"))
    assert d.class_names == ("cat", "dog") and d.input_shape == (2,)
    with pytest.raises(DataError, match="label column 'kind' not in header"):
        load_data(DataConfig(source="csv", path=str(tmp_path / "t.csv"), label_column="kind"))
    (tmp_path / "bad.csv").write_text("a,y\n1,0\nxx,1\n")
    with pytest.raises(DataError, match=r"bad.csv: line 3, column 'a': 'xx' is not a number"):
        load_data(DataConfig(source="csv", path=str(tmp_path / "bad.csv"), label_column="y"))


def test_image_folder(tmp_path):
    rng = np.random.default_rng(0)
    for cls in ("circle", "square"):
        (tmp_path / cls).mkdir()
        for i in range(6):
            Image.fromarray(rng.integers(0, 255, (10, 10), dtype=np.uint8)).save(tmp_path / cls / f"{i}.png")
    d = load_data(DataConfig(source="image_folder", path=str(tmp_path), image_size=8))
    assert d.input_shape == (1, 8, 8) and d.class_names == ("circle", "square")
    (tmp_path / "square" / "broken.png").write_bytes(b"nope")
    with pytest.raises(DataError, match="broken.png: not a readable image"):
        load_data(DataConfig(source="image_folder", path=str(tmp_path)))


def _write_idx(path, arr: np.ndarray, gz: bool = False) -> None:
    header = struct.pack(">BBBB", 0, 0, 0x08, arr.ndim) + struct.pack(f">{arr.ndim}I", *arr.shape)
    data = header + arr.astype(np.uint8).tobytes()
    if gz:
        with gzip.open(path, "wb") as f:
            f.write(data)
    else:
        path.write_bytes(data)


def test_idx_files(tmp_path):
    rng = np.random.default_rng(0)
    _write_idx(tmp_path / "img.idx", rng.integers(0, 255, (30, 5, 5)))
    _write_idx(tmp_path / "lab.idx.gz", np.arange(30) % 3, gz=True)
    d = load_data(DataConfig(source="idx", path=str(tmp_path / "img.idx"), labels_path=str(tmp_path / "lab.idx.gz")))
    assert d.input_shape == (1, 5, 5) and d.num_classes == 3
    (tmp_path / "trunc.idx").write_bytes((tmp_path / "img.idx").read_bytes()[:-10])
    with pytest.raises(DataError, match="trunc.idx: header says"):
        read_idx(tmp_path / "trunc.idx")


def test_config_errors_name_field_and_choices():
    with pytest.raises(ConfigError, match="field 'source'.*valid choices"):
        validate(DataConfig, {"source": "mnist"}, "study.toml")
    with pytest.raises(ConfigError, match="needs data.label_column"):
        validate(DataConfig, {"source": "csv", "path": "x.csv"}, "study.toml")
