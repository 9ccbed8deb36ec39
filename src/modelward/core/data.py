"""Data sources (DESIGN: core/data.py).

Every source yields a :class:`DataSplit` of float32 inputs and int64 labels, split deterministically by seed:
- scikit-learn's bundled sets: ``digits`` (default; 1x8x8 images in [0, 1]), ``breast_cancer``, ``wine``, ``iris``;
- seeded synthetic generators: ``synthetic_images`` (class prototypes + noise), ``synthetic_tabular``;
- user files: ``npz`` (arrays ``x``, ``y``), ``csv`` (label column named in the config), ``image_folder`` (one
  sub-folder per class), ``idx`` (MNIST-style IDX image + label files).
Nothing is downloaded. Malformed files raise :class:`DataError` naming the file and the problem.
"""

from __future__ import annotations

import csv
import gzip
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import numpy as np
import torch
from pydantic import Field, model_validator

from modelward.core.config import StrictModel
from modelward.core.registry import lazy_exports
from modelward.errors import DataError

Source = Literal[
    "digits", "breast_cancer", "wine", "iris", "synthetic_images", "synthetic_tabular", "npz", "csv", "image_folder",
    "idx", "imagenet",
]
FILE_SOURCES = ("npz", "csv", "image_folder", "idx", "imagenet")
LAZY_SOURCES = ("image_folder", "imagenet", "npz", "idx")


class DataConfig(StrictModel):
    """Where the data comes from and how it is split."""

    source: Source = "digits"
    path: str | None = None  # npz / csv file, image folder, or IDX images file
    labels_path: str | None = None  # IDX labels file
    test_path: str | None = None  # optional separate test file (npz) / IDX test images
    test_labels_path: str | None = None
    # rows of `path` the model was trained on (.npy of indices or a boolean mask, or a text file of indices, one a
    # line); the other rows are its held-out data. For a model trained outside modelward on a single file.
    train_index: str | None = None
    label_column: str | None = None  # CSV
    image_size: int | None = None  # image_folder resize (square); synthetic_images side length
    channels: int = Field(1, ge=1, le=4)  # image_folder: 1 = greyscale, 3 = RGB; synthetic_images channels
    n_samples: int = Field(2000, ge=10)  # synthetic generators
    n_features: int = Field(20, ge=2)  # synthetic_tabular
    num_classes: int = Field(10, ge=2)  # synthetic generators
    noise: float = Field(0.35, ge=0.0)  # synthetic_images
    test_fraction: float = Field(0.2, gt=0.0, lt=1.0)
    max_samples: int | None = Field(None, ge=10)
    standardize: bool = True  # tabular sources: z-score with training statistics
    seed: int = 0
    # data that does not fit in memory (see core/datasets.py): read examples lazily instead of decoding everything
    lazy: bool = False  # image_folder / imagenet / npz (uncompressed) / idx (uncompressed): read on demand
    crop_size: int | None = Field(None, ge=1)  # lazy images: final side after resize (image_size) and crop
    augment: bool = False  # lazy images: random resized crop + horizontal flip for training
    mean: list[float] | None = None  # lazy images: per-channel normalisation (e.g. ImageNet's)
    std: list[float] | None = None
    workers: int = Field(0, ge=0)  # DataLoader worker processes for lazy data
    @model_validator(mode="after")
    def _needs_path(self) -> DataConfig:
        if self.source in FILE_SOURCES and not self.path:
            raise ValueError(f"data.source={self.source!r} needs data.path")
        if self.source == "csv" and not self.label_column:
            raise ValueError("data.source='csv' needs data.label_column (the name of the label column)")
        if self.source == "idx" and not self.labels_path:
            raise ValueError("data.source='idx' needs data.labels_path (the IDX labels file)")
        if self.source == "imagenet" and not self.lazy:
            raise ValueError("data.source='imagenet' is read lazily: set data.lazy = true")
        if self.lazy and self.source not in LAZY_SOURCES:
            raise ValueError(f"data.lazy = true works for sources {list(LAZY_SOURCES)}, not {self.source!r}")
        if self.train_index and self.test_path:
            raise ValueError("data.train_index and data.test_path both say which rows are held out; give one")
        if self.test_path and self.source not in ("npz", "csv", "idx"):
            raise ValueError(f"data.test_path is read for sources npz, csv and idx, not {self.source!r} (which "
                             "would silently re-split); give data.train_index to name the training rows instead")
        if self.train_index and (self.lazy or self.source not in FILE_SOURCES):
            raise ValueError("data.train_index names rows of a user file read into memory (npz, csv, "
                             f"image_folder, idx with lazy = false), not source {self.source!r}")
        if self.train_index and self.max_samples is not None:
            raise ValueError("data.train_index names rows of the whole file: it cannot go with data.max_samples")
        if (self.mean is None) != (self.std is None):
            raise ValueError("data.mean and data.std go together (one value per channel each)")
        return self


@dataclass(frozen=True)
class DataSplit:
    """Train/test tensors plus what a model needs to fit them."""

    name: str
    x_train: torch.Tensor
    y_train: torch.Tensor
    x_test: torch.Tensor
    y_test: torch.Tensor
    num_classes: int
    class_names: tuple[str, ...]
    shape: tuple[int, ...] | None = None  # set for lazy splits, whose x_* are Datasets (see load_lazy_split)

    @property
    def input_shape(self) -> tuple[int, ...]:
        return self.shape if self.shape is not None else tuple(self.x_train.shape[1:])

    @property
    def is_image(self) -> bool:
        return len(self.input_shape) == 3

    def describe(self) -> str:
        return (
            f"{self.name}: {len(self.x_train)} train / {len(self.x_test)} test, input {self.input_shape}, "
            f"{self.num_classes} classes"
        )


# ------------------------------------------------------------------------------------------------------------
def _split(x: np.ndarray, y: np.ndarray, cfg: DataConfig) -> tuple[np.ndarray, ...]:
    from sklearn.model_selection import train_test_split

    counts = np.bincount(y)
    stratify = y if counts[counts > 0].min() >= 2 else None
    try:
        return tuple(train_test_split(x, y, test_size=cfg.test_fraction, random_state=cfg.seed, stratify=stratify))
    except ValueError:
        return tuple(train_test_split(x, y, test_size=cfg.test_fraction, random_state=cfg.seed))


def _encode_labels(y: np.ndarray, where: str) -> tuple[np.ndarray, tuple[str, ...]]:
    if y.ndim != 1:
        raise DataError(f"{where}: labels must be a 1-D array, got shape {y.shape}")
    if len(y) == 0:
        raise DataError(f"{where}: no samples")
    if np.issubdtype(y.dtype, np.integer) and y.min() >= 0:
        names = tuple(str(i) for i in range(int(y.max()) + 1))
        return y.astype(np.int64), names
    classes, inv = np.unique(y.astype(str), return_inverse=True)
    return inv.astype(np.int64), tuple(str(c) for c in classes)


def _subsample(x: np.ndarray, y: np.ndarray, cfg: DataConfig) -> tuple[np.ndarray, np.ndarray]:
    if cfg.max_samples is not None and len(x) > cfg.max_samples:
        idx = np.random.default_rng(cfg.seed).permutation(len(x))[: cfg.max_samples]
        idx.sort()
        return x[idx], y[idx]
    return x, y


def _images_to_nchw(x: np.ndarray, where: str) -> np.ndarray:
    """Accept N×H×W, N×C×H×W or N×H×W×C; integers are scaled from 0..255 to [0, 1]."""
    if x.ndim == 3:
        x = x[:, None]
    elif x.ndim == 4 and x.shape[-1] in (1, 3, 4) and x.shape[1] not in (1, 3, 4):
        x = np.transpose(x, (0, 3, 1, 2))
    elif x.ndim != 4:
        raise DataError(f"{where}: image array must be N×H×W or N×C×H×W (or N×H×W×C), got shape {x.shape}")
    if np.issubdtype(x.dtype, np.integer):
        x = x.astype(np.float32) / 255.0
    return x.astype(np.float32)


def _finish(name: str, x: np.ndarray, y: np.ndarray, cfg: DataConfig, names: tuple[str, ...],
            test: tuple[np.ndarray, np.ndarray] | None = None) -> DataSplit:
    if not np.isfinite(x).all():
        raise DataError(f"{name}: inputs contain NaN or Inf")
    if test is None and cfg.train_index:
        mask = read_train_index(cfg.train_index, len(x))
        x_tr, y_tr, x_te, y_te = x[mask], y[mask], x[~mask], y[~mask]
    elif test is None:
        x, y = _subsample(x, y, cfg)
        x_tr, x_te, y_tr, y_te = _split(x, y, cfg)
    else:
        x_tr, y_tr = x, y
        x_te, y_te = test
    tabular = x_tr.ndim == 2
    if tabular and cfg.standardize:
        mu, sd = x_tr.mean(0), x_tr.std(0)
        sd[sd == 0] = 1.0
        x_tr, x_te = (x_tr - mu) / sd, (x_te - mu) / sd
    n_cls = max(len(names), int(max(y_tr.max(), y_te.max())) + 1)
    return DataSplit(
        name=name,
        x_train=torch.as_tensor(np.ascontiguousarray(x_tr), dtype=torch.float32),
        y_train=torch.as_tensor(y_tr, dtype=torch.int64),
        x_test=torch.as_tensor(np.ascontiguousarray(x_te), dtype=torch.float32),
        y_test=torch.as_tensor(y_te, dtype=torch.int64),
        num_classes=n_cls,
        class_names=names if len(names) == n_cls else tuple(str(i) for i in range(n_cls)),
    )


def read_train_index(path: str, n_rows: int) -> np.ndarray:
    """The boolean training mask over `n_rows` rows from a ``.npy`` (indices or a boolean mask, read without
    pickle) or a text file of row indices (one a line).

    Args:
        path: the index file (``data.train_index``).
        n_rows: the number of rows in the data file it indexes.

    Returns:
        A boolean array, True for training rows; at least one row on each side.

    Example:
        >>> import tempfile, os; f = os.path.join(tempfile.mkdtemp(), "i.txt"); _ = open(f, "w").write("0\\n2\\n")
        >>> read_train_index(f, 4).tolist()
        [True, False, True, False]
    """
    p = _need_file(path, "data.train_index file")
    try:
        if p.suffix == ".npy":
            idx = np.load(p, allow_pickle=False)
        else:
            idx = np.loadtxt(p, dtype=np.int64, ndmin=1)
    except (ValueError, OSError) as e:
        raise DataError(f"{p}: data.train_index: not a .npy array or a text file of row indices ({e})") from None
    if idx.dtype == np.bool_:
        if idx.shape != (n_rows,):
            raise DataError(f"{p}: data.train_index is a mask of {idx.shape} but the data has {n_rows} rows")
        mask = idx.copy()
    else:
        if not np.issubdtype(idx.dtype, np.integer) or idx.ndim != 1:
            raise DataError(f"{p}: data.train_index must be 1-D integer row indices or a boolean mask, got "
                            f"{idx.dtype} {idx.shape}")
        if len(idx) and (idx.min() < 0 or idx.max() >= n_rows):
            raise DataError(f"{p}: data.train_index has rows outside 0..{n_rows - 1}")
        mask = np.zeros(n_rows, bool)
        mask[idx] = True
    if mask.all() or not mask.any():
        raise DataError(f"{p}: data.train_index leaves {'no held-out' if mask.all() else 'no training'} rows")
    return mask


# -- bundled and synthetic --------------------------------------------------------------------------------
def _sklearn(cfg: DataConfig) -> DataSplit:
    from sklearn import datasets

    if cfg.source == "digits":
        d = datasets.load_digits()
        x = (d.images / 16.0).astype(np.float32)[:, None]  # 1×8×8 in [0, 1]
    else:
        d = {"breast_cancer": datasets.load_breast_cancer, "wine": datasets.load_wine, "iris": datasets.load_iris}[
            cfg.source
        ]()
        x = d.data.astype(np.float32)
    names = tuple(str(n) for n in d.target_names)
    return _finish(cfg.source, x, d.target.astype(np.int64), cfg, names)


def _synthetic_images(cfg: DataConfig) -> DataSplit:
    """Each class is a smooth random prototype image; samples are prototype + Gaussian noise, clipped to [0, 1]."""
    rng = np.random.default_rng(cfg.seed)
    side = cfg.image_size or 8
    coarse = rng.random((cfg.num_classes, cfg.channels, max(2, side // 4), max(2, side // 4)))
    protos = torch.nn.functional.interpolate(torch.as_tensor(coarse), size=(side, side), mode="bilinear",
                                             align_corners=False).numpy()
    y = rng.integers(0, cfg.num_classes, cfg.n_samples)
    x = protos[y] + cfg.noise * rng.standard_normal((cfg.n_samples, cfg.channels, side, side))
    x = np.clip(x, 0.0, 1.0).astype(np.float32)
    return _finish("synthetic_images", x, y.astype(np.int64), cfg, tuple(str(i) for i in range(cfg.num_classes)))


def _synthetic_tabular(cfg: DataConfig) -> DataSplit:
    from sklearn.datasets import make_classification

    x, y = make_classification(
        n_samples=cfg.n_samples, n_features=cfg.n_features, n_informative=max(2, cfg.n_features // 2),
        n_redundant=min(2, cfg.n_features // 4), n_classes=cfg.num_classes,
        n_clusters_per_class=1, random_state=cfg.seed,
    )
    return _finish("synthetic_tabular", x.astype(np.float32), y.astype(np.int64), cfg,
                   tuple(str(i) for i in range(cfg.num_classes)))


# -- user files ---------------------------------------------------------------------------------------------
def _need_file(path: str | None, what: str) -> Path:
    p = Path(path or "")
    if not p.exists():
        raise DataError(f"{p}: {what} not found")
    return p


def _read_npz(path: Path) -> tuple[np.ndarray, np.ndarray]:
    try:
        with np.load(path, allow_pickle=False) as f:
            missing = [k for k in ("x", "y") if k not in f.files]
            if missing:
                raise DataError(f"{path}: missing array(s) {missing}; an .npz needs arrays 'x' and 'y' (has {f.files})")
            x, y = f["x"], f["y"]
    except DataError:
        raise
    except ValueError as e:  # object arrays need pickle: refused
        raise DataError(f"{path}: cannot read without unpickling ({e}); save plain numeric arrays") from None
    except Exception as e:  # zipfile.BadZipFile, OSError, ...
        raise DataError(f"{path}: not a valid .npz file ({e})") from None
    if len(x) != len(y):
        raise DataError(f"{path}: x has {len(x)} samples but y has {len(y)}")
    if not np.issubdtype(x.dtype, np.number):
        raise DataError(f"{path}: x must be numeric, got dtype {x.dtype}")
    if x.ndim >= 3:
        x = _images_to_nchw(x, str(path))
    elif x.ndim == 2:
        x = x.astype(np.float32)
    else:
        raise DataError(f"{path}: x must be 2-D (tabular) or 3/4-D (images), got shape {x.shape}")
    return x, y


def _npz(cfg: DataConfig) -> DataSplit:
    path = _need_file(cfg.path, "npz file")
    x, y = _read_npz(path)
    y, names = _encode_labels(y, str(path))
    test = None
    if cfg.test_path:
        tp = _need_file(cfg.test_path, "npz test file")
        xt, yt = _read_npz(tp)
        if xt.shape[1:] != x.shape[1:]:
            raise DataError(f"{tp}: test inputs have shape {xt.shape[1:]}, train inputs {x.shape[1:]}")
        test = (xt, _encode_labels(yt, str(tp))[0])
    return _finish(path.name, x, y, cfg, names, test)


def _csv(cfg: DataConfig) -> DataSplit:
    path = _need_file(cfg.path, "CSV file")
    x, lab = _read_csv(path, cfg)
    test = None
    if cfg.test_path:  # the user's own held-out file: never re-split
        tp = _need_file(cfg.test_path, "CSV test file")
        xt, lab_t = _read_csv(tp, cfg)
        if xt.shape[1:] != x.shape[1:]:
            raise DataError(f"{tp}: test rows have {xt.shape[1]} features, train rows {x.shape[1]}")
        both = np.concatenate([lab, lab_t])
        y_all, names = _csv_labels(both, str(path))
        return _finish(path.name, x, y_all[: len(lab)], cfg, names, (xt, y_all[len(lab):]))
    y, names = _csv_labels(lab, str(path))
    return _finish(path.name, x, y, cfg, names, test)


def _csv_labels(lab: np.ndarray, where: str) -> tuple[np.ndarray, tuple[str, ...]]:
    try:
        as_int = lab.astype(np.int64)
        return _encode_labels(as_int, where) if (as_int >= 0).all() else _encode_labels(lab, where)
    except ValueError:
        return _encode_labels(lab, where)


def _read_csv(path: Path, cfg: DataConfig) -> tuple[np.ndarray, np.ndarray]:
    try:
        with path.open(newline="", encoding="utf-8") as f:
            rows = list(csv.reader(f))
    except UnicodeDecodeError:
        raise DataError(f"{path}: not a UTF-8 text file") from None
    if len(rows) < 2:
        raise DataError(f"{path}: needs a header row and at least one data row")
    header = [h.strip() for h in rows[0]]
    if cfg.label_column not in header:
        raise DataError(f"{path}: label column {cfg.label_column!r} not in header; columns are {header}")
    li = header.index(cfg.label_column)
    feats, labels = [], []
    for n, row in enumerate(rows[1:], start=2):
        if not row or all(not c.strip() for c in row):
            continue
        if len(row) != len(header):
            raise DataError(f"{path}: line {n} has {len(row)} fields, header has {len(header)}")
        labels.append(row[li].strip())
        vals = []
        for j, c in enumerate(row):
            if j == li:
                continue
            try:
                vals.append(float(c))
            except ValueError:
                raise DataError(f"{path}: line {n}, column {header[j]!r}: {c!r} is not a number") from None
        feats.append(vals)
    return np.asarray(feats, dtype=np.float32), np.asarray(labels)


_IMG_EXT = {".png", ".jpg", ".jpeg", ".bmp", ".gif", ".tif", ".tiff", ".webp"}


def _image_folder(cfg: DataConfig) -> DataSplit:
    from PIL import Image, UnidentifiedImageError

    root = _need_file(cfg.path, "image folder")
    if not root.is_dir():
        raise DataError(f"{root}: expected a folder with one sub-folder per class")
    classes = sorted(d.name for d in root.iterdir() if d.is_dir())
    if len(classes) < 2:
        raise DataError(f"{root}: found {len(classes)} class sub-folder(s); need at least 2 (one per class)")
    mode = {1: "L", 3: "RGB", 4: "RGBA"}.get(cfg.channels)
    if mode is None:
        raise DataError(f"{root}: data.channels must be 1, 3 or 4 for image folders")
    xs, ys, size = [], [], cfg.image_size
    for ci, cname in enumerate(classes):
        files = sorted(p for p in (root / cname).iterdir() if p.suffix.lower() in _IMG_EXT)
        if not files:
            raise DataError(f"{root / cname}: no image files ({sorted(_IMG_EXT)})")
        for p in files:
            try:
                with Image.open(p) as im:
                    im = im.convert(mode)
                    if size is None:
                        size = im.size[0]
                    if im.size != (size, size):
                        im = im.resize((size, size))
                    arr = np.asarray(im, dtype=np.float32) / 255.0
            except (UnidentifiedImageError, OSError) as e:
                raise DataError(f"{p}: not a readable image ({e})") from None
            xs.append(arr[None] if arr.ndim == 2 else arr.transpose(2, 0, 1))
            ys.append(ci)
    return _finish(root.name, np.stack(xs), np.asarray(ys, dtype=np.int64), cfg, tuple(classes))


_IDX_DTYPES = {0x08: np.uint8, 0x09: np.int8, 0x0B: ">i2", 0x0C: ">i4", 0x0D: ">f4", 0x0E: ">f8"}


def read_idx(path: str | Path) -> np.ndarray:
    """Read an MNIST-style IDX file (optionally gzipped): magic 0x0000TTDD, DD big-endian int32 dims, data."""
    path = _need_file(str(path), "IDX file")
    opener = gzip.open if path.suffix == ".gz" else open
    try:
        with opener(path, "rb") as f:
            raw = f.read()
    except OSError as e:
        raise DataError(f"{path}: cannot read ({e})") from None
    if len(raw) < 4 or raw[0] != 0 or raw[1] != 0:
        raise DataError(f"{path}: not an IDX file (bad magic number)")
    code, ndim = raw[2], raw[3]
    if code not in _IDX_DTYPES:
        raise DataError(f"{path}: unknown IDX data type 0x{code:02x}")
    if ndim == 0 or len(raw) < 4 + 4 * ndim:
        raise DataError(f"{path}: truncated IDX header")
    dims = struct.unpack(f">{ndim}I", raw[4 : 4 + 4 * ndim])
    dt = np.dtype(_IDX_DTYPES[code])
    expected = int(np.prod(dims)) * dt.itemsize
    body = raw[4 + 4 * ndim :]
    if len(body) != expected:
        raise DataError(f"{path}: header says {dims} ({expected} bytes of data) but file has {len(body)} bytes")
    return np.frombuffer(body, dtype=dt).reshape(dims)


def _idx_pair(images: str, labels: str) -> tuple[np.ndarray, np.ndarray]:
    x, y = read_idx(images), read_idx(labels)
    if len(x) != len(y):
        raise DataError(f"{images}: {len(x)} images but {labels} has {len(y)} labels")
    return _images_to_nchw(x, images) if x.ndim >= 3 else x.astype(np.float32), y.astype(np.int64)


def _idx(cfg: DataConfig) -> DataSplit:
    assert cfg.path and cfg.labels_path
    x, y = _idx_pair(cfg.path, cfg.labels_path)
    test = None
    if cfg.test_path:
        if not cfg.test_labels_path:
            raise DataError(f"{cfg.test_path}: data.test_labels_path is needed with an IDX test file")
        test = _idx_pair(cfg.test_path, cfg.test_labels_path)
    names = tuple(str(i) for i in range(int(y.max()) + 1))
    return _finish(Path(cfg.path).name, x, y, cfg, names, test)


def load_data(cfg: DataConfig | None = None) -> DataSplit:
    """Load and split the data set described by `cfg` (default: scikit-learn digits, seed 0)."""
    cfg = cfg or DataConfig()
    if cfg.lazy:
        raise DataError(f"{cfg.path}: data.lazy = true: this command needs the data in memory; "
                        "use modelward.core.datasets.load_lazy (or set data.lazy = false for data that fits)")
    if cfg.source in ("digits", "breast_cancer", "wine", "iris"):
        return _sklearn(cfg)
    return {
        "synthetic_images": _synthetic_images,
        "synthetic_tabular": _synthetic_tabular,
        "npz": _npz,
        "csv": _csv,
        "image_folder": _image_folder,
        "idx": _idx,
    }[cfg.source](cfg)


# the lazy loaders live in core.datasets (which imports this module); re-exported here by name only, so that
# ``from modelward.core.data import load_lazy`` keeps working without an import circle
__getattr__, __dir__ = lazy_exports(__name__, {"load_lazy": "modelward.core.datasets:load_lazy",
                                               "load_lazy_split": "modelward.core.datasets:load_lazy_split"})
