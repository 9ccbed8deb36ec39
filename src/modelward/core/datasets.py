"""Data that does not fit in memory: lazy image folders, the ImageNet layout and memory-mapped arrays.

:func:`modelward.core.data.load_data` decodes a whole data set into float32 tensors, which is right for the bundled
sets and small files but impossible for ImageNet (≈ 770 GB at 224² in float32). This module gives the same sources
as ``torch.utils.data.Dataset`` objects that read one example at a time:

- :class:`ImageFolderDataset` decodes a file with Pillow when it is indexed (``root/<class>/<file>``);
- :func:`imagenet_folders` maps the ImageNet layout ``train/<class>/…`` and ``val/<class>/…`` to train and test;
- :func:`memmap_arrays` opens ``.npy`` files, uncompressed ``.npz`` members and uncompressed IDX files as
  read-only memory maps, so only the pages a batch touches are read;
- :class:`ArrayDataset` turns such arrays (N×H×W, N×C×H×W or N×H×W×C, integer pixels scaled to [0, 1]) into
  float32 examples one at a time.

Transforms are written in torch (there is no CPU build of torchvision here): :class:`Resize`, :class:`CenterCrop`,
:class:`RandomResizedCrop`, :class:`RandomHorizontalFlip`, :class:`Normalize` and :class:`Compose`. Random
transforms draw from torch's default generator, which ``DataLoader`` seeds per worker from the loader's own
generator, so a seeded loader (:func:`make_loader`) gives the same batches on every run.

Example:
    >>> from modelward.core.datasets import imagenet_folders, make_loader, standard_transforms
    >>> train, test = imagenet_folders("/data/imagenet", *standard_transforms(224))  # doctest: +SKIP
    >>> loader = make_loader(train, batch_size=256, seed=0, workers=8)  # doctest: +SKIP
"""

from __future__ import annotations

import math
import zipfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from torch.utils.data import DataLoader, Dataset, Subset, TensorDataset

from modelward.core.data import _IDX_DTYPES, DataConfig, DataSplit, _need_file, _split, load_data
from modelward.errors import DataError

IMAGE_EXTENSIONS = (".png", ".jpg", ".jpeg", ".bmp", ".gif", ".tif", ".tiff", ".webp")
IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)

Transform = Callable[[torch.Tensor], torch.Tensor]


# -- transforms (C×H×W float tensors) ----------------------------------------------------------------------
class Compose:
    """Apply transforms in order."""

    def __init__(self, transforms: Sequence[Transform]) -> None:
        self.transforms = list(transforms)

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        for t in self.transforms:
            x = t(x)
        return x


class Resize:
    """Resize so that the shorter side is `size` (an int) or to exactly (H, W) (a pair); bilinear, antialiased."""

    def __init__(self, size: int | tuple[int, int]) -> None:
        self.size = size

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        h, w = x.shape[-2:]
        if isinstance(self.size, int):
            if min(h, w) == self.size:
                return x
            scale = self.size / min(h, w)
            out = (max(1, round(h * scale)), max(1, round(w * scale)))
        else:
            out = tuple(self.size)
        return F.interpolate(x[None], size=out, mode="bilinear", align_corners=False, antialias=True)[0]


def _crop(x: torch.Tensor, top: int, left: int, h: int, w: int) -> torch.Tensor:
    return x[..., top : top + h, left : left + w]


class CenterCrop:
    """Crop the central `size`×`size` window (padding with zeros if the image is smaller)."""

    def __init__(self, size: int) -> None:
        self.size = size

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        h, w = x.shape[-2:]
        if h < self.size or w < self.size:
            ph, pw = max(0, self.size - h), max(0, self.size - w)
            x = F.pad(x, (pw // 2, pw - pw // 2, ph // 2, ph - ph // 2))
            h, w = x.shape[-2:]
        return _crop(x, (h - self.size) // 2, (w - self.size) // 2, self.size, self.size)


class RandomResizedCrop:
    """Inception-style crop: a random area fraction in `scale` and aspect ratio in `ratio`, resized to `size`².

    Falls back to a central crop after 10 failed draws, as the standard implementation does.
    """

    def __init__(self, size: int, scale: tuple[float, float] = (0.08, 1.0),
                 ratio: tuple[float, float] = (3 / 4, 4 / 3)) -> None:
        self.size, self.scale, self.ratio = size, scale, ratio

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        h, w = x.shape[-2:]
        area = h * w
        log_r = (math.log(self.ratio[0]), math.log(self.ratio[1]))
        for _ in range(10):
            target = area * float(torch.empty(1).uniform_(*self.scale))
            aspect = math.exp(float(torch.empty(1).uniform_(*log_r)))
            cw, ch = round(math.sqrt(target * aspect)), round(math.sqrt(target / aspect))
            if 0 < cw <= w and 0 < ch <= h:
                top = int(torch.randint(0, h - ch + 1, (1,)))
                left = int(torch.randint(0, w - cw + 1, (1,)))
                return Resize((self.size, self.size))(_crop(x, top, left, ch, cw))
        side = min(h, w)
        return Resize((self.size, self.size))(_crop(x, (h - side) // 2, (w - side) // 2, side, side))


class RandomHorizontalFlip:
    """Flip left-right with probability `p`."""

    def __init__(self, p: float = 0.5) -> None:
        self.p = p

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        return x.flip(-1) if float(torch.rand(1)) < self.p else x


class Normalize:
    """Subtract a per-channel mean and divide by a per-channel standard deviation."""

    def __init__(self, mean: Sequence[float], std: Sequence[float]) -> None:
        self.mean = torch.tensor(mean, dtype=torch.float32)[:, None, None]
        self.std = torch.tensor(std, dtype=torch.float32)[:, None, None]

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        if x.shape[0] != self.mean.shape[0]:
            raise DataError(f"Normalize has {self.mean.shape[0]} channel statistics, the image {x.shape[0]} channels")
        return (x - self.mean) / self.std


def standard_transforms(size: int = 224, resize: int | None = None, augment: bool = True,
                        mean: Sequence[float] | None = IMAGENET_MEAN,
                        std: Sequence[float] | None = IMAGENET_STD) -> tuple[Transform, Transform]:
    """The usual ImageNet recipe: (train, test) = (random resized crop + flip, resize to 256/224·size + centre crop)."""
    resize = resize or round(size * 256 / 224)
    norm = [Normalize(mean, std)] if mean is not None and std is not None else []
    train: list[Transform] = (
        [RandomResizedCrop(size), RandomHorizontalFlip()] if augment else [Resize(resize), CenterCrop(size)]
    )
    return Compose(train + norm), Compose([Resize(resize), CenterCrop(size), *norm])


# -- image folders -------------------------------------------------------------------------------------------
def _to_chw(arr: np.ndarray) -> torch.Tensor:
    t = torch.from_numpy(np.array(arr, copy=True))  # copy: decoded images and memmaps are read-only
    t = t[None] if t.dim() == 2 else t.permute(2, 0, 1)
    return t.to(torch.float32).div_(255.0) if not t.is_floating_point() else t.to(torch.float32)


class ImageFolderDataset(Dataset):
    """``root/<class>/<image>`` read lazily: each item is decoded with Pillow when it is indexed.

    Args:
        root: folder with one sub-folder per class (sorted names give the class indices).
        channels: 1 (greyscale), 3 (RGB) or 4 (RGBA).
        transform: applied to the C×H×W float image in [0, 1]; None keeps the file's size.
        classes: the class names to use, in index order (e.g. the training folder's, for a validation folder).
    Returns:
        ``(image, label)`` pairs; ``len`` is the number of image files.
    Example:
        >>> ds = ImageFolderDataset("/data/pets", channels=3, transform=CenterCrop(64))  # doctest: +SKIP
    """

    def __init__(self, root: str | Path, channels: int = 3, transform: Transform | None = None,
                 classes: Sequence[str] | None = None) -> None:
        self.root = Path(root)
        if not self.root.is_dir():
            raise DataError(f"{self.root}: expected a folder with one sub-folder per class")
        found = sorted(d.name for d in self.root.iterdir() if d.is_dir())
        if classes is None:
            classes = found
            if len(classes) < 2:
                raise DataError(f"{self.root}: found {len(classes)} class sub-folder(s); need at least 2")
        else:
            unknown = sorted(set(found) - set(classes))
            if unknown:
                raise DataError(f"{self.root}: class folder(s) {unknown[:5]} are not among the training classes")
        self.classes = tuple(classes)
        self.mode = {1: "L", 3: "RGB", 4: "RGBA"}.get(channels)
        if self.mode is None:
            raise DataError(f"{self.root}: channels must be 1, 3 or 4, got {channels}")
        self.channels = channels
        self.transform = transform
        self.samples: list[tuple[str, int]] = []
        for ci, name in enumerate(self.classes):
            folder = self.root / name
            if not folder.is_dir():
                continue
            files = sorted(p for p in folder.iterdir() if p.suffix.lower() in IMAGE_EXTENSIONS)
            self.samples.extend((str(p), ci) for p in files)
        if not self.samples:
            raise DataError(f"{self.root}: no image files ({', '.join(IMAGE_EXTENSIONS)})")
        # labels as one small array: the sampler and stratified code read them without decoding images
        self.targets = np.fromiter((c for _, c in self.samples), dtype=np.int64, count=len(self.samples))

    def __len__(self) -> int:
        return len(self.samples)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, int]:
        from PIL import Image, UnidentifiedImageError

        path, label = self.samples[i]
        try:
            with Image.open(path) as im:
                arr = np.asarray(im.convert(self.mode))
        except (UnidentifiedImageError, OSError) as e:
            raise DataError(f"{path}: not a readable image ({e})") from None
        x = _to_chw(arr)
        return (self.transform(x) if self.transform else x), label


def imagenet_folders(root: str | Path, train_transform: Transform | None = None,
                     test_transform: Transform | None = None,
                     channels: int = 3) -> tuple[ImageFolderDataset, ImageFolderDataset]:
    """The ImageNet layout: ``root/train/<class>/…`` is the training set, ``root/val/<class>/…`` the test set.

    The validation folder must use the training folder's class names (it may lack some); labels follow the
    training folder's sorted class list, so both sets agree on every index.
    """
    root = Path(root)
    for sub in ("train", "val"):
        if not (root / sub).is_dir():
            raise DataError(f"{root}: the ImageNet layout needs {root / sub} (one sub-folder per class)")
    train = ImageFolderDataset(root / "train", channels, train_transform)
    test = ImageFolderDataset(root / "val", channels, test_transform, classes=train.classes)
    return train, test


# -- memory-mapped arrays ------------------------------------------------------------------------------------
def _npz_member_memmap(path: Path, key: str) -> np.ndarray:
    """Memory-map one member of an *uncompressed* .npz (``np.savez``); compressed members cannot be mapped."""
    with zipfile.ZipFile(path) as zf:
        name = f"{key}.npy"
        try:
            info = zf.getinfo(name)
        except KeyError:
            raise DataError(f"{path}: no array {key!r} (has {sorted(n[:-4] for n in zf.namelist())})") from None
        if info.compress_type != zipfile.ZIP_STORED:
            raise DataError(f"{path}: array {key!r} is compressed (np.savez_compressed) and cannot be memory-mapped; "
                            "save it with np.savez or as .npy files")
    with path.open("rb") as f:
        f.seek(info.header_offset)
        local = f.read(30)
        if local[:4] != b"PK\x03\x04":
            raise DataError(f"{path}: corrupt zip entry for {key!r}")
        name_len = int.from_bytes(local[26:28], "little")
        extra_len = int.from_bytes(local[28:30], "little")
        f.seek(info.header_offset + 30 + name_len + extra_len)
        return _npy_memmap_at(path, f)


def _npy_memmap_at(path: Path, f) -> np.ndarray:  # noqa: ANN001 - an open binary file positioned at a .npy header
    fmt = np.lib.format
    try:
        version = fmt.read_magic(f)
        if version == (1, 0):
            shape, fortran, dtype = fmt.read_array_header_1_0(f)
        elif version == (2, 0):
            shape, fortran, dtype = fmt.read_array_header_2_0(f)
        else:
            raise ValueError(f".npy format version {version} is not supported (1.0 and 2.0 are)")
    except ValueError as e:
        raise DataError(f"{path}: not a .npy array ({e})") from None
    if dtype.hasobject:
        raise DataError(f"{path}: object arrays need unpickling and are refused; save plain numeric arrays")
    return np.memmap(path, dtype=dtype, mode="r", offset=f.tell(), shape=shape, order="F" if fortran else "C")


def _idx_memmap(path: Path) -> np.ndarray:
    if path.suffix == ".gz":
        raise DataError(f"{path}: a gzipped IDX file cannot be memory-mapped; gunzip it first")
    with path.open("rb") as f:
        head = f.read(4)
        if len(head) < 4 or head[0] != 0 or head[1] != 0 or head[2] not in _IDX_DTYPES:
            raise DataError(f"{path}: not an IDX file (bad magic number)")
        ndim = head[3]
        dims = tuple(int.from_bytes(f.read(4), "big") for _ in range(ndim))
    dt = np.dtype(_IDX_DTYPES[head[2]])
    expected = 4 + 4 * ndim + int(np.prod(dims)) * dt.itemsize
    if path.stat().st_size != expected:
        raise DataError(f"{path}: header says {dims} but the file has {path.stat().st_size} bytes, not {expected}")
    return np.memmap(path, dtype=dt, mode="r", offset=4 + 4 * ndim, shape=dims)


def memmap_array(path: str | Path, key: str | None = None) -> np.ndarray:
    """Open ``.npy``, an uncompressed ``.npz`` member (`key`) or an uncompressed IDX file as a read-only memmap."""
    p = Path(path)
    if not p.exists():
        raise DataError(f"{p}: file not found")
    if p.suffix == ".npy":
        with p.open("rb") as f:
            return _npy_memmap_at(p, f)
    if p.suffix == ".npz":
        return _npz_member_memmap(p, key or "x")
    return _idx_memmap(p)


def memmap_arrays(path: str | Path, labels_path: str | Path | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Inputs and labels as memory maps: an .npz with arrays ``x`` and ``y``, or two .npy / IDX files."""
    p = Path(path)
    if p.suffix == ".npz" and labels_path is None:
        x, y = _npz_member_memmap(p, "x"), _npz_member_memmap(p, "y")
    else:
        if labels_path is None:
            raise DataError(f"{p}: a labels file is needed with .npy / IDX inputs (data.labels_path)")
        x, y = memmap_array(p), memmap_array(labels_path)
    if len(x) != len(y):
        raise DataError(f"{p}: {len(x)} inputs but {len(y)} labels")
    return x, y


class ArrayDataset(Dataset):
    """Examples read one at a time from a (memory-mapped) array: integer pixels scaled to [0, 1], images as C×H×W.

    Args:
        x: N×D (tabular), N×H×W, N×C×H×W or N×H×W×C.
        y: N integer labels.
        indices: the subset of rows to expose (e.g. a train or test split), default all.
        transform: applied to each float32 example.
    """

    def __init__(self, x: np.ndarray, y: np.ndarray, indices: np.ndarray | None = None,
                 transform: Transform | None = None) -> None:
        if x.ndim not in (2, 3, 4):
            raise DataError(f"inputs must be N×D or images (N×H×W, N×C×H×W, N×H×W×C), got shape {x.shape}")
        self.x, self.y = x, y
        self.indices = np.arange(len(x)) if indices is None else np.asarray(indices)
        self.channels_last = x.ndim == 4 and x.shape[-1] in (1, 3, 4) and x.shape[1] not in (1, 3, 4)
        self.transform = transform
        self.targets = np.asarray(y[self.indices], dtype=np.int64)

    def __len__(self) -> int:
        return len(self.indices)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, int]:
        j = int(self.indices[i])
        row = np.asarray(self.x[j])
        if self.x.ndim == 2:
            t = torch.from_numpy(row.astype(np.float32, copy=True))
        elif self.x.ndim == 3:
            t = _to_chw(row)
        else:
            t = _to_chw(row) if self.channels_last else _to_chw(np.moveaxis(row, 0, -1))
        return (self.transform(t) if self.transform else t), int(self.y[j])


# -- loaders ------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class LazySplit:
    """A train and a test ``Dataset`` with what a model needs to fit them (the lazy twin of ``DataSplit``)."""

    name: str
    train: Dataset
    test: Dataset
    num_classes: int
    class_names: tuple[str, ...]
    input_shape: tuple[int, ...]

    def describe(self) -> str:
        return (f"{self.name}: {len(self.train)} train / {len(self.test)} test (read lazily), "
                f"input {self.input_shape}, {self.num_classes} classes")


def make_loader(dataset: Dataset, batch_size: int, seed: int | None = 0, workers: int = 0, shuffle: bool = True,
                drop_last: bool = False, pin_memory: bool = False) -> DataLoader:
    """A ``DataLoader`` whose order and random transforms are fixed by `seed` (also with worker processes)."""
    gen = torch.Generator().manual_seed(seed) if seed is not None else None
    return DataLoader(dataset, batch_size=batch_size, shuffle=shuffle, drop_last=drop_last, num_workers=workers,
                      generator=gen, pin_memory=pin_memory, persistent_workers=workers > 0,
                      prefetch_factor=2 if workers > 0 else None)


# -- lazy (out-of-memory) loading ----------------------------------------------------------------------------
def _split_indices(targets: np.ndarray, cfg: DataConfig) -> tuple[np.ndarray, np.ndarray]:
    idx = np.arange(len(targets))
    if cfg.max_samples is not None and len(idx) > cfg.max_samples:
        idx = np.sort(np.random.default_rng(cfg.seed).permutation(len(idx))[: cfg.max_samples])
    tr, te, _, _ = _split(idx, np.asarray(targets)[idx], cfg)
    return np.sort(tr), np.sort(te)


def load_lazy_split(cfg: DataConfig) -> DataSplit:
    """:func:`load_lazy` in the shape of a :class:`DataSplit`: ``x_train``/``x_test`` are ``Dataset`` objects that
    yield (input, label) pairs and ``y_train``/``y_test`` are None — what :func:`modelward.core.train.train` takes."""
    ls = load_lazy(cfg)
    return DataSplit(ls.name, ls.train, None, ls.test, None, ls.num_classes, ls.class_names,  # type: ignore[arg-type]
                     shape=ls.input_shape)


def load_lazy(cfg: DataConfig) -> LazySplit:
    """Open the data set described by `cfg` without decoding it: a :class:`LazySplit`.

    Image folders are decoded one file at a time (Pillow) with torch transforms (resize to ``image_size``, crop to
    ``crop_size``, optional ``augment`` and ``mean``/``std``); ``imagenet`` uses ``train/`` and ``val/`` as train and
    test; uncompressed ``.npz`` and IDX files are memory-mapped. Sources that are small anyway are loaded with
    :func:`load_data` and wrapped, so every source works here.
    """
    if not cfg.lazy:
        split = load_data(cfg)
        return LazySplit(split.name, TensorDataset(split.x_train, split.y_train),
                            TensorDataset(split.x_test, split.y_test), split.num_classes, split.class_names,
                            split.input_shape)
    if cfg.source in ("image_folder", "imagenet"):
        side = cfg.crop_size or cfg.image_size
        train_t: list = []
        test_t: list = []
        if cfg.augment and side:
            train_t.append(RandomResizedCrop(side))
            train_t.append(RandomHorizontalFlip())
        elif cfg.image_size:
            train_t.append(Resize(cfg.image_size))
            if cfg.crop_size:
                train_t.append(CenterCrop(cfg.crop_size))
        if cfg.image_size:
            test_t.append(Resize(cfg.image_size))
        if cfg.crop_size:
            test_t.append(CenterCrop(cfg.crop_size))
        if not cfg.crop_size and cfg.image_size:  # a square output, so that examples can be batched
            square = CenterCrop(cfg.image_size)
            test_t.append(square)
            if not cfg.augment:
                train_t.append(square)
        if cfg.mean is not None and cfg.std is not None:
            norm = Normalize(cfg.mean, cfg.std)
            train_t.append(norm)
            test_t.append(norm)
        train_tf, test_tf = Compose(train_t), Compose(test_t)
        root = _need_file(cfg.path, "image folder")
        if cfg.source == "imagenet":
            train, test = imagenet_folders(root, train_tf, test_tf, cfg.channels)
            classes = train.classes
        else:
            full_train = ImageFolderDataset(root, cfg.channels, train_tf)
            full_test = ImageFolderDataset(root, cfg.channels, test_tf, classes=full_train.classes)
            tr, te = _split_indices(full_train.targets, cfg)
            train, test = Subset(full_train, tr.tolist()), Subset(full_test, te.tolist())
            classes = full_train.classes
        shape = tuple(test[0][0].shape)
        return LazySplit(root.name, train, test, len(classes), tuple(classes), shape)
    # memory-mapped arrays
    path = _need_file(cfg.path, f"{cfg.source} file")
    x, y = memmap_arrays(path, cfg.labels_path)
    labels = np.asarray(y, dtype=np.int64)
    if labels.ndim != 1 or (labels.size and labels.min() < 0):
        raise DataError(f"{path}: labels must be a 1-D array of non-negative integers for lazy loading")
    tr, te = _split_indices(labels, cfg)
    train, test = ArrayDataset(x, labels, tr), ArrayDataset(x, labels, te)
    n_cls = int(labels.max()) + 1
    return LazySplit(path.name, train, test, n_cls, tuple(str(i) for i in range(n_cls)), tuple(train[0][0].shape))
