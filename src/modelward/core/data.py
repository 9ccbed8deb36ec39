"""Data sources (DESIGN: core/data.py).

Every source yields a :class:`DataSplit` of float32 inputs and int64 labels, split deterministically by seed:
- scikit-learn's bundled sets: ``digits`` (default; 1x8x8 images in [0, 1]), ``breast_cancer``, ``wine``, ``iris``;
- seeded synthetic generators: ``synthetic_images`` (class prototypes + noise), ``synthetic_tabular``;
- user files: ``npz`` (arrays ``x``, ``y``), ``csv`` (label column named in the config), ``image_folder`` (one
  sub-folder per class), ``idx`` (MNIST-style IDX image + label files), ``hf_datasets`` (Hugging Face ``datasets``
  from local parquet, arrow or CSV/JSON files, or a ``save_to_disk`` folder);
- user code: ``entrypoint`` (a factory returning ``torch.utils.data`` Datasets or DataLoaders; code, run only when
  the operator trusts it);
- text (:mod:`modelward.core.text`): a ``text_column`` of a CSV or ``datasets`` file turned into token ids by a local
  ``tokenizer``, integer token ids with ``tokens = true``, or the seeded ``synthetic_text`` task. Token ids stay
  ``int64`` (never standardised or cast to float); the split records the padding id.
Nothing is downloaded. Malformed files raise :class:`DataError` naming the file and the problem.
"""

from __future__ import annotations

import csv
import gzip
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import numpy as np
import torch
from pydantic import Field, model_validator

from modelward.core.config import StrictModel
from modelward.core.entrypoints import load_entrypoint
from modelward.core.registry import lazy_exports
from modelward.core.text import Tokens, synthetic_text, token_rows, tokenize
from modelward.errors import DataError

Source = Literal[
    "digits", "breast_cancer", "wine", "iris", "synthetic_images", "synthetic_tabular", "npz", "csv", "image_folder",
    "idx", "imagenet", "synthetic_text", "hf_datasets", "entrypoint",
]
FILE_SOURCES = ("npz", "csv", "image_folder", "idx", "imagenet", "hf_datasets")
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
    # text (core/text.py): raw text in a column, turned into token ids by a local tokenizer; or token ids already
    text_column: str | None = None  # csv / hf_datasets: the column holding the text
    tokenizer: str | None = None  # a local tokenizer: save_pretrained folder or tokenizer.json (with text_column)
    max_length: int = Field(128, ge=4)  # tokens kept per row (text_column, synthetic_text)
    tokens: bool = False  # npz / csv: x holds integer token ids, right-padded with pad_id
    pad_id: int = Field(0, ge=0)  # the padding id of token ids given as numbers (a tokenizer says its own)
    vocab_size: int = Field(200, ge=16)  # synthetic_text
    label_noise: float = Field(0.0, ge=0.0, le=1.0)  # synthetic_text: labels replaced by a random class
    # user code (source = "entrypoint"): "pkg.mod:factory" returning (train, test) Datasets/DataLoaders of (x, y)
    entrypoint: str | None = None
    kwargs: dict[str, Any] = Field(default_factory=dict)  # passed to the data entry point
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
        if self.test_path and self.source not in ("npz", "csv", "idx", "hf_datasets"):
            raise ValueError(f"data.test_path is read for sources npz, csv, idx and hf_datasets, not {self.source!r} (which "
                             "would silently re-split); give data.train_index to name the training rows instead")
        if self.train_index and (self.lazy or self.source not in FILE_SOURCES):
            raise ValueError("data.train_index names rows of a user file read into memory (npz, csv, "
                             f"image_folder, idx with lazy = false), not source {self.source!r}")
        if self.train_index and self.max_samples is not None:
            raise ValueError("data.train_index names rows of the whole file: it cannot go with data.max_samples")
        if (self.mean is None) != (self.std is None):
            raise ValueError("data.mean and data.std go together (one value per channel each)")
        if self.source == "entrypoint" and not self.entrypoint:
            raise ValueError("data.source='entrypoint' needs data.entrypoint = \"package.module:factory\"")
        if self.entrypoint and self.source != "entrypoint":
            raise ValueError(f"data.entrypoint is read for source 'entrypoint', not {self.source!r}")
        if self.source == "hf_datasets" and not (self.label_column and (self.text_column or self.tokens)):
            raise ValueError("data.source='hf_datasets' needs data.label_column and the inputs: data.text_column "
                             "(with data.tokenizer) or data.tokens = true (an input_ids column)")
        if self.text_column and not self.tokenizer:
            raise ValueError("data.text_column needs data.tokenizer (a local tokenizer folder or tokenizer.json, "
                             "e.g. the model's save_pretrained folder)")
        if self.text_column and self.source not in ("csv", "hf_datasets"):
            raise ValueError(f"data.text_column is read for sources csv and hf_datasets, not {self.source!r}")
        if self.tokens and self.source not in ("npz", "csv", "hf_datasets", "entrypoint"):
            raise ValueError(f"data.tokens = true is read for sources npz, csv, hf_datasets and entrypoint, not "
                             f"{self.source!r}")
        if self.tokens and self.text_column:
            raise ValueError("data.tokens = true (ids given) and data.text_column (text to tokenize): give one")
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
    # text (token ids, int64): the padding id, id -> token string (None: unknown), ids never substituted
    pad_id: int | None = None
    vocab: tuple[str, ...] | None = None
    special_ids: tuple[int, ...] = ()
    held_out_given: bool = False  # the source gave its own test set (entry point): members known exactly

    @property
    def input_shape(self) -> tuple[int, ...]:
        return self.shape if self.shape is not None else tuple(self.x_train.shape[1:])

    @property
    def is_image(self) -> bool:
        return len(self.input_shape) == 3

    @property
    def is_text(self) -> bool:
        """Token ids (int64 rows, right-padded with ``pad_id``)."""
        return self.pad_id is not None

    @property
    def modality(self) -> str:
        """``"text"``, ``"image"`` or ``"tabular"``."""
        return "text" if self.is_text else "image" if self.is_image else "tabular"

    def token_name(self, i: int) -> str:
        """Token id `i` as text (its vocabulary entry when known)."""
        return self.vocab[i] if self.vocab is not None and 0 <= i < len(self.vocab) else f"#{i}"

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
            test: tuple[np.ndarray, np.ndarray] | None = None, tokens: Tokens | None = None) -> DataSplit:
    if tokens is not None:
        return _finish_tokens(name, x, y, cfg, names, test, tokens)
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
        held_out_given=test is not None,
        name=name,
        x_train=torch.as_tensor(np.ascontiguousarray(x_tr), dtype=torch.float32),
        y_train=torch.as_tensor(y_tr, dtype=torch.int64),
        x_test=torch.as_tensor(np.ascontiguousarray(x_te), dtype=torch.float32),
        y_test=torch.as_tensor(y_te, dtype=torch.int64),
        num_classes=n_cls,
        class_names=names if len(names) == n_cls else tuple(str(i) for i in range(n_cls)),
    )


def _finish_tokens(name: str, x: np.ndarray, y: np.ndarray, cfg: DataConfig, names: tuple[str, ...],
                   test: tuple[np.ndarray, np.ndarray] | None, tokens: Tokens) -> DataSplit:
    """Token ids: split as any rows (never standardised, kept int64), padded to one length for train and test."""
    if test is None and cfg.train_index:
        mask = read_train_index(cfg.train_index, len(x))
        x_tr, y_tr, x_te, y_te = x[mask], y[mask], x[~mask], y[~mask]
    elif test is None:
        x, y = _subsample(x, y, cfg)
        x_tr, x_te, y_tr, y_te = _split(x, y, cfg)
    else:
        (x_tr, y_tr), (x_te, y_te) = (x, y), test
    width = max(x_tr.shape[1], x_te.shape[1])
    x_tr, x_te = (np.pad(a, ((0, 0), (0, width - a.shape[1])), constant_values=tokens.pad_id) for a in (x_tr, x_te))
    n_cls = max(len(names), int(max(y_tr.max(), y_te.max())) + 1)
    return DataSplit(name, torch.as_tensor(x_tr, dtype=torch.int64), torch.as_tensor(y_tr, dtype=torch.int64),
                     torch.as_tensor(x_te, dtype=torch.int64), torch.as_tensor(y_te, dtype=torch.int64), n_cls,
                     names if len(names) == n_cls else tuple(str(i) for i in range(n_cls)),
                     pad_id=tokens.pad_id, vocab=tokens.vocab, special_ids=tokens.special,
                     held_out_given=test is not None)


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


def _read_npz(path: Path, tokens: bool = False, pad_id: int = 0) -> tuple[np.ndarray, np.ndarray]:
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
    if tokens:
        return token_rows(x, pad_id, str(path)), y
    if x.ndim >= 3:
        x = _images_to_nchw(x, str(path))
    elif x.ndim == 2:
        x = x.astype(np.float32)
    else:
        raise DataError(f"{path}: x must be 2-D (tabular) or 3/4-D (images), got shape {x.shape}")
    return x, y


def _npz(cfg: DataConfig) -> DataSplit:
    path = _need_file(cfg.path, "npz file")
    x, y = _read_npz(path, cfg.tokens, cfg.pad_id)
    y, names = _encode_labels(y, str(path))
    test = None
    if cfg.test_path:
        tp = _need_file(cfg.test_path, "npz test file")
        xt, yt = _read_npz(tp, cfg.tokens, cfg.pad_id)
        if xt.shape[1:] != x.shape[1:] and not cfg.tokens:
            raise DataError(f"{tp}: test inputs have shape {xt.shape[1:]}, train inputs {x.shape[1:]}")
        test = (xt, _encode_labels(yt, str(tp))[0])
    return _finish(path.name, x, y, cfg, names, test, _given_tokens(cfg))


def _given_tokens(cfg: DataConfig) -> Tokens | None:
    """Token ids given as numbers (``tokens = true``): the configured padding id, no vocabulary."""
    return Tokens(np.zeros((0, 0), np.int64), cfg.pad_id, None, (cfg.pad_id,)) if cfg.tokens else None


def _csv(cfg: DataConfig) -> DataSplit:
    path = _need_file(cfg.path, "CSV file")
    if cfg.text_column:
        train = _read_csv_text(path, cfg)
        test = _read_csv_text(_need_file(cfg.test_path, "CSV test file"), cfg) if cfg.test_path else None
        return _text_rows(path, train, test, cfg)
    x, lab = _read_csv(path, cfg)
    test = None
    if cfg.test_path:  # the user's own held-out file: never re-split
        tp = _need_file(cfg.test_path, "CSV test file")
        xt, lab_t = _read_csv(tp, cfg)
        if xt.shape[1:] != x.shape[1:]:
            raise DataError(f"{tp}: test rows have {xt.shape[1]} features, train rows {x.shape[1]}")
        both = np.concatenate([lab, lab_t])
        y_all, names = _csv_labels(both, str(path))
        if cfg.tokens:
            xt = token_rows(xt, cfg.pad_id, str(tp))
        return _finish(path.name, token_rows(x, cfg.pad_id, str(path)) if cfg.tokens else x, y_all[: len(lab)], cfg,
                       names, (xt, y_all[len(lab):]), _given_tokens(cfg))
    y, names = _csv_labels(lab, str(path))
    if cfg.tokens:
        x = token_rows(x, cfg.pad_id, str(path))
    return _finish(path.name, x, y, cfg, names, test, _given_tokens(cfg))


def _read_csv_text(path: Path, cfg: DataConfig) -> tuple[list[str], np.ndarray]:
    """The text column and the label column of a CSV (other columns are not read)."""
    try:
        with path.open(newline="", encoding="utf-8") as f:
            rows = list(csv.reader(f))
    except UnicodeDecodeError:
        raise DataError(f"{path}: not a UTF-8 text file") from None
    if len(rows) < 2:
        raise DataError(f"{path}: needs a header row and at least one data row")
    header = [h.strip() for h in rows[0]]
    for col in (cfg.text_column, cfg.label_column):
        if col not in header:
            raise DataError(f"{path}: column {col!r} not in header; columns are {header}")
    ti, li = header.index(str(cfg.text_column)), header.index(str(cfg.label_column))
    texts, labels = [], []
    for n, row in enumerate(rows[1:], start=2):
        if not row or all(not c.strip() for c in row):
            continue
        if len(row) != len(header):
            raise DataError(f"{path}: line {n} has {len(row)} fields, header has {len(header)}")
        texts.append(row[ti])
        labels.append(row[li].strip())
    return texts, np.asarray(labels)


def _text_rows(path: Path, train: tuple[list[str], np.ndarray], test: tuple[list[str], np.ndarray] | None,
               cfg: DataConfig, label_names: tuple[str, ...] | None = None) -> DataSplit:
    """Raw texts (and labels) of a training file and an optional test file, tokenized together (one padding)."""
    texts = train[0] + (test[0] if test else [])
    tok = tokenize(texts, str(cfg.tokenizer), cfg.max_length, str(path))
    labels = np.concatenate([train[1], test[1]]) if test else train[1]
    if label_names is not None:
        y_all, names = labels.astype(np.int64), label_names
    else:
        y_all, names = _csv_labels(labels, str(path))
    n = len(train[0])
    held = (tok.ids[n:], y_all[n:]) if test else None
    return _finish(path.name, tok.ids[:n], y_all[:n], cfg, names, held, tok)


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


# -- text, Hugging Face datasets, entry points --------------------------------------------------------------
def _synthetic_text(cfg: DataConfig) -> DataSplit:
    tok, y = synthetic_text(cfg.n_samples, cfg.num_classes, cfg.vocab_size, cfg.max_length, cfg.seed,
                            cfg.label_noise)
    return _finish("synthetic_text", tok.ids, y, cfg, tuple(str(i) for i in range(cfg.num_classes)), tokens=tok)


def _import_datasets():  # noqa: ANN202 - the module
    import os

    os.environ.setdefault("HF_DATASETS_OFFLINE", "1")  # local files only: a download attempt fails
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    try:
        import datasets
    except ImportError:
        raise DataError("data.source='hf_datasets' needs the datasets library: pip install -e '.[text]'") from None
    datasets.disable_progress_bars()
    return datasets


def _hf_table(path: Path, cache: str) -> dict[str, object]:
    """A local ``datasets`` file or ``save_to_disk`` folder as ``{split: Dataset}`` (a file is split "train")."""
    ds_lib = _import_datasets()
    readers = {".parquet": ds_lib.Dataset.from_parquet, ".csv": ds_lib.Dataset.from_csv,
               ".json": ds_lib.Dataset.from_json, ".jsonl": ds_lib.Dataset.from_json}
    try:
        if path.is_dir():
            loaded = ds_lib.load_from_disk(str(path), keep_in_memory=True)
            return dict(loaded) if isinstance(loaded, ds_lib.DatasetDict) else {"train": loaded}
        if path.suffix == ".arrow":
            return {"train": ds_lib.Dataset.from_file(str(path), in_memory=True)}
        if path.suffix not in readers:
            raise DataError(f"{path}: data.source='hf_datasets' reads .parquet, .arrow, .csv, .json/.jsonl files or "
                            "a save_to_disk folder")
        return {"train": readers[path.suffix](str(path), cache_dir=cache, keep_in_memory=True)}
    except DataError:
        raise
    except Exception as e:  # noqa: BLE001 - the library's many error types: one line naming the file
        raise DataError(f"{path}: datasets could not read it ({type(e).__name__}: {str(e).splitlines()[0]})") from None


def _hf_columns(ds: object, cfg: DataConfig, where: str) -> tuple[list, np.ndarray, tuple[str, ...] | None]:
    cols = list(ds.column_names)  # type: ignore[attr-defined]
    x_col = cfg.text_column or "input_ids"
    for c in (x_col, cfg.label_column):
        if c not in cols:
            raise DataError(f"{where}: column {c!r} not found; columns are {cols}")
    feature = ds.features[cfg.label_column]  # type: ignore[attr-defined]
    names = tuple(feature.names) if hasattr(feature, "names") else None  # a ClassLabel keeps its class names
    return list(ds[x_col]), np.asarray(ds[cfg.label_column]), names  # type: ignore[index]


def _pad_token_lists(rows: list, pad_id: int, where: str) -> np.ndarray:
    width = max((len(r) for r in rows), default=0)
    out = np.full((len(rows), width), pad_id, dtype=np.int64)
    for i, r in enumerate(rows):
        out[i, : len(r)] = r
    return token_rows(out, pad_id, where)


def _hf_datasets(cfg: DataConfig) -> DataSplit:
    """Local Hugging Face ``datasets`` files: the training file (``path``) and the held-out one (``test_path``), or
    a ``save_to_disk`` folder with "train" and "test" splits (members and non-members as the owner split them)."""
    import tempfile

    path = _need_file(cfg.path, "datasets file or folder")
    with tempfile.TemporaryDirectory(prefix="modelward-datasets-") as cache:  # nothing left in ~/.cache
        splits = _hf_table(path, cache)
        if cfg.test_path:
            test_splits = _hf_table(_need_file(cfg.test_path, "datasets test file"), cache)
            train_ds, test_ds = splits.get("train"), next(iter(test_splits.values()))
        else:
            train_ds, test_ds = splits.get("train"), splits.get("test")
        if train_ds is None:
            raise DataError(f"{path}: no 'train' split; splits are {sorted(splits)}")
        x, y, names = _hf_columns(train_ds, cfg, str(path))
        test = _hf_columns(test_ds, cfg, str(cfg.test_path or path)) if test_ds is not None else None
    if test is not None and names is not None and test[2] not in (None, names):
        raise DataError(f"{cfg.test_path or path}: the test split's class names {test[2]} differ from {names}")
    if cfg.text_column:
        return _text_rows(path, (x, y), (test[0], test[1]) if test else None, cfg, names)
    labels = np.concatenate([y, test[1]]) if test else y
    if names is not None:
        y_all = labels.astype(np.int64)
    else:
        y_all, names = _csv_labels(labels, str(path))
    ids = _pad_token_lists(x + (test[0] if test else []), cfg.pad_id, str(path))
    n = len(x)
    held = (ids[n:], y_all[n:]) if test else None
    return _finish(path.name, ids[:n], y_all[:n], cfg, names, held, _given_tokens(cfg))


def _materialise(data: object, where: str, limit: int | None) -> tuple[list, list]:
    """Every (x, y) of a ``Dataset`` or ``DataLoader`` (items may be ``(x, y)`` or dicts with ``input_ids`` and
    ``label``/``labels``), up to `limit` examples."""
    from torch.utils.data import DataLoader, Dataset

    def split(item: object) -> tuple[object, object]:
        if isinstance(item, dict):
            x = item.get("input_ids", item.get("x"))
            y = item.get("label", item.get("labels", item.get("y")))
            if x is None or y is None:
                raise DataError(f"{where}: items are dicts without input_ids/x and label/labels/y: {sorted(item)}")
            return x, y
        if isinstance(item, tuple | list) and len(item) >= 2:
            return item[0], item[1]
        raise DataError(f"{where}: items must be (x, y) pairs or dicts with input_ids and label, got "
                        f"{type(item).__name__}")

    xs: list = []
    ys: list = []
    if isinstance(data, DataLoader):
        for batch in data:
            bx, by = split(batch)
            xs.extend(list(torch.as_tensor(bx)) if not isinstance(bx, list) else bx)
            ys.extend(torch.as_tensor(by).reshape(-1).tolist())
            if limit is not None and len(xs) >= limit:
                break
    elif isinstance(data, Dataset) or hasattr(data, "__getitem__"):
        n = len(data)  # type: ignore[arg-type]
        for i in range(n if limit is None else min(n, limit)):
            bx, by = split(data[i])  # type: ignore[index]
            xs.append(bx)
            ys.append(int(torch.as_tensor(by).reshape(-1)[0]))
    else:
        raise DataError(f"{where}: expected a torch.utils.data Dataset or DataLoader, got {type(data).__name__}")
    if not xs:
        raise DataError(f"{where}: no examples")
    return xs[:limit] if limit else xs, ys[:limit] if limit else ys


def _entrypoint_data(cfg: DataConfig) -> DataSplit:
    """Data from your own code: ``factory(**kwargs)`` returns ``(train, test)`` (or ``{"train": …, "test": …}``) of
    Datasets/DataLoaders — members and non-members exactly as you split them — or one of them, split here."""
    where = f"data.entrypoint {cfg.entrypoint!r}"
    # the operator's trust, never the file's: the config's mark (the operator's trust list, allow_code), or
    # --trust-code / MODELWARD_TRUST_CODE (core/entrypoints.py)
    factory = load_entrypoint(str(cfg.entrypoint), field="data.entrypoint", trusted=cfg.code_trusted,
                              source=cfg.config_source)
    out = factory(**cfg.kwargs)
    if isinstance(out, dict):
        if "train" not in out:
            raise DataError(f"{where} returned a dict without 'train' (keys {sorted(out)})")
        parts = [out["train"], *([out["test"]] if out.get("test") is not None else [])]
    elif isinstance(out, tuple | list) and len(out) == 2:
        parts = list(out)
    else:
        parts = [out]
    rows = [_materialise(part, where, cfg.max_samples) for part in parts]

    def stack(xs: list) -> np.ndarray:
        if cfg.tokens:
            return _pad_token_lists([torch.as_tensor(x).reshape(-1).tolist() for x in xs], cfg.pad_id, where)
        rows = [torch.as_tensor(x) for x in xs]
        if not rows[0].is_floating_point() and rows[0].dim() == 1:
            raise DataError(f"{where}: the inputs are rows of integers: if they are token ids, set data.tokens = true "
                            "(and data.pad_id); other inputs must be float tensors")
        try:
            return torch.stack(rows).numpy().astype(np.float32)
        except RuntimeError as e:
            raise DataError(f"{where}: the inputs do not have one shape ({str(e).splitlines()[0]})") from None

    xs = [stack(r[0]) for r in rows]
    ys = [np.asarray(r[1], dtype=np.int64) for r in rows]
    if cfg.tokens and len(xs) == 2:
        width = max(a.shape[1] for a in xs)
        xs = [np.pad(a, ((0, 0), (0, width - a.shape[1])), constant_values=cfg.pad_id) for a in xs]
    names = tuple(str(i) for i in range(int(max(a.max() for a in ys)) + 1))
    # the entry point returns data as the model consumes it: never standardised here
    plain = cfg.model_copy(update={"standardize": False, "max_samples": None})
    test = (xs[1], ys[1]) if len(xs) == 2 else None
    return _finish(str(cfg.entrypoint), xs[0], ys[0], plain, names, test, _given_tokens(cfg))


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
        "synthetic_text": _synthetic_text,
        "hf_datasets": _hf_datasets,
        "entrypoint": _entrypoint_data,
    }[cfg.source](cfg)


# the lazy loaders live in core.datasets (which imports this module); re-exported here by name only, so that
# ``from modelward.core.data import load_lazy`` keeps working without an import circle
__getattr__, __dir__ = lazy_exports(__name__, {"load_lazy": "modelward.core.datasets:load_lazy",
                                               "load_lazy_split": "modelward.core.datasets:load_lazy_split"})
