"""Binary data sets for the bias experiments (seed 002 Tables 9.2, 9.5–9.6).

Bundled and user files go through :mod:`modelward.core.data` (scikit-learn sets, ``npz``, ``csv``); the
scikit-feature repository's MATLAB files (``X``, ``Y`` arrays — the format of arcene, colon, glioma, prostate,
smokers, pc/mac in Table 9.5) are read here with ``scipy.io.loadmat`` (plain numeric arrays only; nothing is
unpickled). Labels are made binary with class 1 the majority (Def. 9.1's convention), or from a chosen pair.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from modelward.core.data import DataConfig, load_data
from modelward.errors import DataError


def load_mat(path: str | Path, x_key: str = "X", y_key: str = "Y") -> tuple[np.ndarray, np.ndarray]:
    """Read a scikit-feature ``.mat`` file: a numeric (N, d) matrix ``X`` and N labels ``Y``."""
    from scipy.io import loadmat

    p = Path(path)
    if not p.is_file():
        raise DataError(f"{p}: .mat file not found")
    try:
        mat = loadmat(str(p))
    except Exception as e:  # scipy raises ValueError / MatReadError / OSError on malformed files
        raise DataError(f"{p}: not a readable MATLAB .mat file ({e})") from None
    missing = [k for k in (x_key, y_key) if k not in mat]
    if missing:
        keys = sorted(k for k in mat if not k.startswith("__"))
        raise DataError(f"{p}: missing variable(s) {missing}; the file has {keys}")
    x, y = np.asarray(mat[x_key]), np.asarray(mat[y_key]).ravel()
    if hasattr(x, "toarray"):
        x = x.toarray()
    if x.ndim != 2 or not np.issubdtype(x.dtype, np.number):
        raise DataError(f"{p}: {x_key} must be a numeric (N, d) matrix, got {x.dtype} {x.shape}")
    if len(x) != len(y):
        raise DataError(f"{p}: {x_key} has {len(x)} rows but {y_key} has {len(y)} labels")
    return x.astype(np.float64), y


def binarize(y: np.ndarray, classes: tuple[object, object] | None = None, where: str = "data"
             ) -> tuple[np.ndarray, np.ndarray]:
    """Binary labels and the mask of kept rows. With ``classes=(a, b)`` rows of a → 0, b → 1 (others dropped);
    otherwise the labels must have two values and the majority becomes 1."""
    y = np.asarray(y)
    if classes is not None:
        a, b = (np.asarray(c).astype(y.dtype) if y.dtype.kind in "iuf" else str(c) for c in classes)
        ys = y if y.dtype.kind in "iuf" else y.astype(str)
        keep = (ys == a) | (ys == b)
        if not (ys == a).any() or not (ys == b).any():
            raise DataError(f"{where}: classes {classes} not both present; labels are {np.unique(y)[:10]}")
        return (ys[keep] == b).astype(np.int64), keep
    values, counts = np.unique(y, return_counts=True)
    if len(values) != 2:
        raise DataError(f"{where}: {len(values)} label values ({values[:10]}); choose two with 'classes = [a, b]'")
    majority = values[np.argmax(counts)] if counts[0] != counts[1] else values[1]
    return (y == majority).astype(np.int64), np.ones(len(y), dtype=bool)


def load_arrays(data: DataConfig | None = None, mat_path: str | None = None) -> tuple[np.ndarray, np.ndarray, str]:
    """All rows (train + test of core.data's split, unstandardised) as float64 arrays, and a name."""
    if mat_path is not None:
        x, y = load_mat(mat_path)
        return x, y, Path(mat_path).stem
    cfg = (data or DataConfig()).model_copy(update={"standardize": False})
    split = load_data(cfg)
    x = np.concatenate([split.x_train.numpy(), split.x_test.numpy()]).astype(np.float64)
    y = np.concatenate([split.y_train.numpy(), split.y_test.numpy()])
    return x, y, split.name
