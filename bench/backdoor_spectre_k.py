"""SPECTRE's dimension k on the saved models of bench/backdoor_detection.py: the fixed k = 8 against the authors'
search over k (``Spectre(dims="auto")``, their ``rcov_auto_quantum_filter``), ROC AUC of the row scores over all
training rows and within the target class, per model. Reads the models (read-only); trains nothing.

    nice -n 15 .venv/bin/python -W ignore bench/backdoor_spectre_k.py --models runs/bench/backdoor --data digits \
        --attack blend
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from backdoor_detection import load_run_model  # noqa: E402

from modelward.backdoor.detect.data.base import roc_auc  # noqa: E402
from modelward.backdoor.detect.data.spectre import Spectre  # noqa: E402
from modelward.backdoor.features import penultimate  # noqa: E402
from modelward.backdoor.study import BackdoorStudyConfig  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--models", required=True, help="the --out folder of bench/backdoor_detection.py")
    ap.add_argument("--data", default="digits")
    ap.add_argument("--attack", default="blend")
    ap.add_argument("--seeds", type=int, default=10)
    a = ap.parse_args()
    out = Path(a.models)
    cfg = BackdoorStudyConfig.model_validate_json((out / "config.json").read_text())
    rows = []
    print("seed | k=8 AUC | in target | auto AUC | in target | k chosen for the target")
    for seed in range(a.seeds):
        model, data, _ = load_run_model(cfg, out, f"{a.data}|{a.attack}|{seed}")
        ch = np.load(out / "models" / f"{a.data}_{a.attack}_{seed}" / "changed_rows.npz")
        x, y = data.x_train.clone(), data.y_train.clone()
        idx = torch.as_tensor(ch["index"])
        x[idx], y[idx] = torch.as_tensor(ch["x"]), torch.as_tensor(ch["y"])
        truth, tgt = ch["poisoned"].astype(bool), y.numpy() == int(ch["target"])
        feats = penultimate(model, x).numpy()
        row: list[float] = []
        for dims in (8, "auto"):
            s = Spectre(dims=dims).scan(None, x, y, features=feats)  # type: ignore[arg-type]
            row += [roc_auc(s.scores, truth), roc_auc(s.scores[tgt], truth[tgt])]
        k = next(p["dims"] for p in s.per_class if p["class"] == int(ch["target"]))
        rows.append(row)
        print(seed, " ".join(f"{v:.3f}" for v in row), k, flush=True)
    print("mean", " ".join(f"{v:.3f}" for v in np.mean(rows, 0)))


if __name__ == "__main__":
    main()
