"""Make the files `examples/assess_own_model.toml` reads, the way a user's own project would have them: a model
trained outside modelward (plain PyTorch, saved with ``torch.save(model.state_dict(), "model.pt")``) on its own
train/test CSV files. Run it from this folder: ``python prepare.py`` (seconds on a CPU; scikit-learn's bundled
breast-cancer data, nothing downloaded).
"""

from __future__ import annotations

import csv
import sys
from pathlib import Path

import numpy as np
import torch
from sklearn.datasets import load_breast_cancer
from sklearn.model_selection import train_test_split

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from nets import mlp  # noqa: E402


def write_csv(path: Path, x: np.ndarray, y: np.ndarray, names: list[str]) -> None:
    with path.open("w", newline="") as f:
        w = csv.writer(f)
        w.writerow([*names, "label"])
        for row, label in zip(x, y, strict=True):
            w.writerow([*(f"{v:.6g}" for v in row), int(label)])


def main(out: Path = HERE, steps: int = 300) -> None:
    d = load_breast_cancer()
    names = [n.replace(" ", "_") for n in d.feature_names]
    x_tr, x_te, y_tr, y_te = train_test_split(d.data, d.target, test_size=0.25, random_state=0, stratify=d.target)
    write_csv(out / "train.csv", x_tr, y_tr, names)
    write_csv(out / "test.csv", x_te, y_te, names)
    # the same preprocessing `modelward` applies to CSVs (standardize = true): z-scores with training statistics
    mu, sd = x_tr.mean(0), x_tr.std(0)
    xt = torch.as_tensor((x_tr - mu) / sd, dtype=torch.float32)
    yt = torch.as_tensor(y_tr)
    torch.manual_seed(0)
    model = mlp((xt.shape[1],), 2)
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    for _ in range(steps):
        opt.zero_grad()
        torch.nn.functional.cross_entropy(model(xt), yt).backward()
        opt.step()
    model.eval()
    with torch.no_grad():
        acc = float((model(torch.as_tensor((x_te - mu) / sd, dtype=torch.float32)).argmax(1).numpy() == y_te).mean())
    torch.save(model.state_dict(), out / "model.pt")
    print(f"wrote {out / 'train.csv'}, {out / 'test.csv'} and {out / 'model.pt'} (test accuracy {acc:.3f})")


if __name__ == "__main__":
    main()
