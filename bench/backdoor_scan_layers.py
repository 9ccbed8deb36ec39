"""Data-level detection on the saved models of bench/backdoor_detection.py, per representation: activation
clustering, spectral signatures and SPECTRE reading the penultimate features or the last convolutional block's
output (``[scan] layer``), ROC AUC of the row scores over all training rows (mean, worst model) and within the
target class. Reads the models (read-only); trains nothing.

    OMP_NUM_THREADS=1 nice -n 10 .venv/bin/python -W ignore bench/backdoor_scan_layers.py --models runs/bench/backdoor \\
        --out runs/bench/backdoor_scan_layers
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from backdoor_detection import load_run_model  # noqa: E402

from modelward.backdoor.detect.data.activation_clustering import ActivationClustering  # noqa: E402
from modelward.backdoor.detect.data.base import roc_auc  # noqa: E402
from modelward.backdoor.detect.data.spectral import SpectralSignature  # noqa: E402
from modelward.backdoor.detect.data.spectre import Spectre  # noqa: E402
from modelward.backdoor.features import LAYERS, representation  # noqa: E402
from modelward.backdoor.study import BackdoorStudyConfig  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--models", required=True, help="the --out folder of bench/backdoor_detection.py")
    ap.add_argument("--out", default="runs/bench/backdoor_scan_layers")
    ap.add_argument("--data", default="digits,rgb")
    ap.add_argument("--attacks", default="badnets,blend,wanet,clean_label")
    ap.add_argument("--seeds", type=int, default=10)
    a = ap.parse_args()
    torch.set_num_threads(1)
    src, out = Path(a.models), Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    cfg = BackdoorStudyConfig.model_validate_json((src / "config.json").read_text())
    per_model, summary = [], []
    for ds in a.data.split(","):
        for attack in a.attacks.split(","):
            got: dict[tuple[str, str], list[tuple[float, float]]] = {}
            for seed in range(a.seeds):
                folder = src / "models" / f"{ds}_{attack}_{seed}"
                if not (folder / "changed_rows.npz").exists():
                    continue
                model, data, _ = load_run_model(cfg, src, f"{ds}|{attack}|{seed}")
                ch = np.load(folder / "changed_rows.npz")
                x, y = data.x_train.clone(), data.y_train.clone()
                idx = torch.as_tensor(ch["index"])
                x[idx], y[idx] = torch.as_tensor(ch["x"]), torch.as_tensor(ch["y"])
                truth, tgt = ch["poisoned"].astype(bool), y.numpy() == int(ch["target"])
                for layer in LAYERS:
                    feats = representation(model, x, layer).numpy()
                    for det in (ActivationClustering(seed=seed), SpectralSignature(), Spectre(seed=seed)):
                        s = det.scan(None, x, y, features=feats)
                        auc, auc_t = roc_auc(s.scores, truth), roc_auc(s.scores[tgt], truth[tgt])
                        got.setdefault((layer, det.name), []).append((auc, auc_t))
                        per_model.append({"data": ds, "attack": attack, "seed": seed, "layer": layer,
                                          "method": det.name, "auc": auc, "auc_in_target": auc_t})
            for (layer, method), v in got.items():
                arr = np.array(v)
                summary.append({"data": ds, "attack": attack, "layer": layer, "method": method, "models": len(v),
                                "auc_mean": float(arr[:, 0].mean()), "auc_worst": float(arr[:, 0].min()),
                                "auc_in_target_mean": float(arr[:, 1].mean())})
                print(f"{ds:6s} {attack:11s} {layer:11s} {method:21s} AUC {arr[:, 0].mean():.3f} "
                      f"(worst {arr[:, 0].min():.3f}; in target {arr[:, 1].mean():.3f})", flush=True)
    (out / "scan_layers.json").write_text(json.dumps({"per_model": per_model, "summary": summary}, indent=1))
    lines = ["| data | attack | layer | method | AUC mean (worst; in target) |", "|---|---|---|---|---|"]
    lines += [f"| {r['data']} | {r['attack']} | {r['layer']} | {r['method']} | {r['auc_mean']:.3f} "
              f"({r['auc_worst']:.3f}; {r['auc_in_target_mean']:.3f}) |" for r in summary]
    (out / "scan_layers.md").write_text("\n".join(lines) + "\n")
    print(f"wrote {out}/scan_layers.json, scan_layers.md")


if __name__ == "__main__":
    main()
