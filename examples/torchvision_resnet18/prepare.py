"""Make the files `examples/assess_torchvision_resnet18.toml` reads, as a user's own project would have them: a
torchvision ResNet-18 trained from scratch in plain PyTorch on 3×32×32 images (CIFAR-sized; seeded synthetic images
here, nothing downloaded) and saved with ``torch.save(model.state_dict(), "model.pth")``, next to its train/test
arrays (``train.npz``, ``test.npz``: ``x`` uint8 N×32×32×3, ``y`` int).

Needs torchvision (the vision extra: ``make vision``, then run it with ``.venv-vision/bin/python prepare.py``).
Run it from anywhere: ``python examples/torchvision_resnet18/prepare.py`` (a few minutes on 2 CPU cores;
``--steps``/``--train`` make it smaller).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

HERE = Path(__file__).resolve().parent


def images(n: int, classes: int, seed: int, protos: np.ndarray, noise: float = 0.2) -> tuple[np.ndarray, np.ndarray]:
    """Each class is a faint smooth colour pattern around mid-grey; an image is its pattern plus pixel noise (the
    classes differ by at most ±0.12 per pixel under noise of σ 0.2: easy to learn, and as easy to attack in L∞ as
    natural images are), as uint8 HWC."""
    rng = np.random.default_rng(seed)
    y = rng.integers(0, classes, n)
    x = protos[y] + noise * rng.standard_normal((n, 32, 32, 3))
    return (np.clip(x, 0, 1) * 255).round().astype(np.uint8), y.astype(np.int64)


def torchvision():  # noqa: ANN201 - the module
    """torchvision, imported as modelward does beside a CPU torch (see modelward.core.sources.import_torchvision)."""
    try:
        from modelward.core.sources import import_torchvision
    except ImportError:  # modelward not installed: plain import (a torchvision built for this torch)
        import torchvision as tv

        return tv
    return import_torchvision()


def main(out: Path = HERE, n_train: int = 2000, n_test: int = 1000, steps: int = 200, seed: int = 0,
         noise: float = 0.2, contrast: float = 0.24) -> float:
    classes = 10
    rng = np.random.default_rng(seed)
    coarse = torch.as_tensor(rng.random((classes, 3, 4, 4)), dtype=torch.float32)
    smooth = F.interpolate(coarse, size=(32, 32), mode="bilinear", align_corners=False).permute(0, 2, 3, 1).numpy()
    protos = 0.5 + contrast * (smooth - 0.5)
    x_tr, y_tr = images(n_train, classes, seed + 1, protos, noise)
    x_te, y_te = images(n_test, classes, seed + 2, protos, noise)
    np.savez(out / "train.npz", x=x_tr, y=y_tr)
    np.savez(out / "test.npz", x=x_te, y=y_te)

    def tensor(x: np.ndarray) -> torch.Tensor:  # the preprocessing modelward applies to uint8 images: /255, NCHW
        return torch.as_tensor(x, dtype=torch.float32).permute(0, 3, 1, 2) / 255.0

    xt, yt = tensor(x_tr), torch.as_tensor(y_tr)
    torch.manual_seed(seed)
    model = torchvision().models.resnet18(num_classes=classes)
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9, weight_decay=5e-4)
    gen = torch.Generator().manual_seed(seed)
    model.train()
    for _ in range(steps):
        idx = torch.randint(len(xt), (64,), generator=gen)
        opt.zero_grad()
        F.cross_entropy(model(xt[idx]), yt[idx]).backward()
        opt.step()
    model.eval()
    with torch.no_grad():
        acc = float((model(tensor(x_te)).argmax(1).numpy() == y_te).mean())
    torch.save(model.state_dict(), out / "model.pth")
    print(f"wrote {out / 'train.npz'}, {out / 'test.npz'} and {out / 'model.pth'} (test accuracy {acc:.3f})")
    return acc


if __name__ == "__main__":
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", type=Path, default=HERE)
    p.add_argument("--train", type=int, default=2000, help="training images")
    p.add_argument("--steps", type=int, default=200, help="SGD steps of 64 images")
    a = p.parse_args()
    sys.exit(0 if main(a.out, a.train, steps=a.steps) > 0 else 1)
