"""Lazy data: image folders, the ImageNet layout, memory-mapped arrays and the torch transforms."""

from __future__ import annotations

import gzip
import struct
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from modelward.core import datasets as ds
from modelward.core.data import DataConfig, load_data, load_lazy
from modelward.errors import DataError


def _folder(root: Path, classes: dict[str, int], size: tuple[int, int] = (12, 10), seed: int = 0) -> None:
    rng = np.random.default_rng(seed)
    for name, n in classes.items():
        (root / name).mkdir(parents=True, exist_ok=True)
        for i in range(n):
            Image.fromarray(rng.integers(0, 256, (*size, 3), dtype=np.uint8)).save(root / name / f"{i}.png")


def test_image_folder_is_lazy_and_matches_eager_loading(tmp_path: Path) -> None:
    _folder(tmp_path / "pets", {"cat": 6, "dog": 6}, size=(8, 8))
    cfg = DataConfig(source="image_folder", path=str(tmp_path / "pets"), channels=3, test_fraction=0.25)
    eager = load_data(cfg)
    lazy = load_lazy(cfg.model_copy(update={"lazy": True}))
    assert lazy.num_classes == 2 and lazy.class_names == ("cat", "dog") and lazy.input_shape == (3, 8, 8)
    assert len(lazy.train) == len(eager.x_train) and len(lazy.test) == len(eager.x_test)
    # the same deterministic split and the same decoded pixels, one file at a time
    xs = torch.stack([lazy.train[i][0] for i in range(len(lazy.train))])
    ys = torch.tensor([lazy.train[i][1] for i in range(len(lazy.train))])
    assert torch.equal(torch.sort(ys).values, torch.sort(eager.y_train).values)
    assert torch.allclose(torch.sort(xs.flatten()).values, torch.sort(eager.x_train.flatten()).values)


def test_imagenet_layout_uses_val_as_test_with_train_class_indices(tmp_path: Path) -> None:
    _folder(tmp_path / "in" / "train", {"n01": 3, "n02": 3, "n03": 3})
    _folder(tmp_path / "in" / "val", {"n02": 2, "n03": 1})  # val may lack a class
    cfg = DataConfig(source="imagenet", lazy=True, path=str(tmp_path / "in"), channels=3, image_size=10,
                     crop_size=8, mean=list(ds.IMAGENET_MEAN), std=list(ds.IMAGENET_STD))
    split = load_lazy(cfg)
    assert len(split.train) == 9 and len(split.test) == 3 and split.num_classes == 3
    assert sorted(split.test[i][1] for i in range(3)) == [1, 1, 2]
    assert split.input_shape == (3, 8, 8)
    _folder(tmp_path / "in" / "val", {"n99": 1})
    with pytest.raises(DataError, match="n99"):
        load_lazy(cfg)
    with pytest.raises(DataError, match="train"):
        load_lazy(cfg.model_copy(update={"path": str(tmp_path / "in" / "val")}))


def test_unreadable_image_names_the_file(tmp_path: Path) -> None:
    _folder(tmp_path / "f", {"a": 2, "b": 2})
    (tmp_path / "f" / "a" / "broken.png").write_bytes(b"not a png")
    data = ds.ImageFolderDataset(tmp_path / "f")
    bad = next(i for i, (p, _) in enumerate(data.samples) if p.endswith("broken.png"))
    with pytest.raises(DataError, match="broken.png"):
        data[bad]


def test_uncompressed_npz_is_memory_mapped_and_compressed_is_refused(tmp_path: Path) -> None:
    x = np.random.default_rng(0).integers(0, 256, (20, 6, 6, 3), dtype=np.uint8)
    y = np.arange(20) % 4
    np.savez(tmp_path / "d.npz", x=x, y=y)
    mx, my = ds.memmap_arrays(tmp_path / "d.npz")
    assert isinstance(mx, np.memmap) and np.array_equal(mx, x) and np.array_equal(my, y)
    split = load_lazy(DataConfig(source="npz", lazy=True, path=str(tmp_path / "d.npz")))
    assert split.input_shape == (3, 6, 6) and split.num_classes == 4
    img, label = split.train[0]
    assert img.dtype == torch.float32 and 0.0 <= float(img.min()) and float(img.max()) <= 1.0
    np.savez_compressed(tmp_path / "c.npz", x=x, y=y)
    with pytest.raises(DataError, match="compressed"):
        ds.memmap_arrays(tmp_path / "c.npz")


def test_idx_memmap_matches_reader_and_gz_is_refused(tmp_path: Path) -> None:
    from modelward.core.data import read_idx

    imgs = np.random.default_rng(1).integers(0, 256, (7, 5, 4), dtype=np.uint8)
    p = tmp_path / "x.idx"
    p.write_bytes(struct.pack(">BBBB", 0, 0, 0x08, 3) + struct.pack(">3I", 7, 5, 4) + imgs.tobytes())
    assert np.array_equal(ds.memmap_array(p), read_idx(p))
    gz = tmp_path / "x.idx.gz"
    gz.write_bytes(gzip.compress(p.read_bytes()))
    with pytest.raises(DataError, match="gunzip"):
        ds.memmap_array(gz)
    p.write_bytes(p.read_bytes()[:-3])
    with pytest.raises(DataError, match="bytes"):
        ds.memmap_array(p)


def test_transforms() -> None:
    x = torch.rand(3, 20, 30)
    assert ds.Resize(10)(x).shape == (3, 10, 15)
    assert ds.Resize((7, 9))(x).shape == (3, 7, 9)
    c = ds.CenterCrop(10)(x)
    assert torch.equal(c, x[:, 5:15, 10:20])
    assert ds.CenterCrop(24)(x).shape == (3, 24, 24)  # padded
    torch.manual_seed(0)
    assert ds.RandomResizedCrop(8)(x).shape == (3, 8, 8)
    assert torch.equal(ds.RandomHorizontalFlip(p=1.0)(x), x.flip(-1))
    n = ds.Normalize([0.5] * 3, [0.25] * 3)(torch.full((3, 2, 2), 0.75))
    assert torch.allclose(n, torch.ones(3, 2, 2))
    with pytest.raises(DataError, match="channel"):
        ds.Normalize([0.5], [0.5])(x)


def test_seeded_loader_with_workers_repeats_batches_and_random_transforms(tmp_path: Path) -> None:
    _folder(tmp_path / "f", {"a": 4, "b": 4}, size=(16, 16))
    train_t, _ = ds.standard_transforms(8, augment=True)
    data = ds.ImageFolderDataset(tmp_path / "f", transform=train_t)

    def batches() -> list[torch.Tensor]:
        return [xb for xb, _ in ds.make_loader(data, batch_size=4, seed=3, workers=1)]

    a, b = batches(), batches()
    assert all(torch.equal(u, v) for u, v in zip(a, b, strict=True))
    assert a[0].shape == (4, 3, 8, 8)


def test_lazy_config_errors_name_the_field() -> None:
    from pydantic import ValidationError

    with pytest.raises(ValidationError, match="lazy"):
        DataConfig(source="imagenet", path="x")
    with pytest.raises(ValidationError, match="lazy"):
        DataConfig(source="digits", lazy=True)
    with pytest.raises(DataError, match="load_lazy"):
        load_data(DataConfig(source="npz", path="x.npz", lazy=True))
