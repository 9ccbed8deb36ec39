"""Clean-label backdoors and model-level detection (issue 41, fourth round): why Neural Cleanse and MM-BD miss them,
and a neuron-stimulation statistic (ABS, Liu et al., CCS 2019) calibrated against clean reference models.

ABS's premise: a backdoor is carried by a few inner neurons that, raised far enough, send *every* input to the target
class whatever else is in it (the trigger's feature dominates), while a natural feature only helps its class. Its
stimulation analysis is used here (not its trigger reverse-engineering): for every channel n of the last convolutional
block, that channel's whole feature map is set to v (the rest of the image's activations kept) for v on a grid up to
``--scale`` × the channel's largest activation on clean images, and for every class c

    score_c(n) = max_v  min_{x: y(x) ≠ c}  (z_c − max_{j≠c} z_j)(x; n := v)        (ABS's elevation difference)
    s_c        = max_n score_c(n)

(the least-elevated input decides: a channel that sends *all* other classes' inputs to c). s_c is compared with the
same class in clean reference models (``CleanReference``, linear scale: s_c can be negative), leave-one-out: each
clean model against the other clean models, each backdoored model against the clean models of the other seeds.

    OMP_NUM_THREADS=1 nice -n 10 .venv/bin/python -W ignore bench/backdoor_stimulation.py --out runs/bench/backdoor_stimulation
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from modelward.backdoor.detect.model.reference import CleanReference
from modelward.backdoor.experiment import defender_split
from modelward.backdoor.features import last_feature_map, last_linear
from modelward.backdoor.study import BackdoorStudyConfig, run_config, run_folder
from modelward.core.data import DataConfig, load_data
from modelward.core.io import load_state_dict
from modelward.core.zoo import build_model

DATA = {"digits": DataConfig(source="digits"),
        "rgb": DataConfig(source="synthetic_images", channels=3, image_size=16, n_samples=3000)}


@torch.no_grad()
def stimulation(model: nn.Module, x: torch.Tensor, y: torch.Tensor, num_classes: int, values: int = 9,
                scale: float = 3.0, where: str = "last_conv") -> tuple[np.ndarray, np.ndarray]:
    """Per class s_c (above) and, per class, the channel reaching it; ``where``: ``"last_conv"`` (a channel's whole
    map) or ``"penultimate"`` (one input unit of the last linear layer)."""
    pen = where == "penultimate"
    layer = dict(model.named_modules())[last_linear(model) if pen else last_feature_map(model, x)]
    acts: list[torch.Tensor] = []
    h = (layer.register_forward_pre_hook(lambda m, i: acts.append(i[0].detach())) if pen else
         layer.register_forward_hook(lambda m, i, o: acts.append(o.detach())))
    model(x)
    h.remove()
    a = acts[0]
    chans = a.shape[1]
    top = a.transpose(0, 1).reshape(chans, -1).amax(1).clamp_min(1e-6)  # each unit's largest clean activation
    best = np.full((chans, num_classes), -np.inf)
    other = torch.stack([y != c for c in range(num_classes)])  # C × N
    state: dict[str, Any] = {}

    def hook(m: nn.Module, i: Any, o: torch.Tensor) -> torch.Tensor:
        o = o.clone()
        o[:, state["n"]] = state["v"]
        return o

    def pre(m: nn.Module, i: tuple[torch.Tensor, ...]) -> tuple[torch.Tensor, ...]:
        return (hook(m, None, i[0]),)

    h = layer.register_forward_pre_hook(pre) if pen else layer.register_forward_hook(hook)
    try:
        for n in range(chans):
            for v in torch.linspace(0, float(scale * top[n]), values):
                state.update(n=n, v=float(v))
                z = model(x)
                for c in range(num_classes):
                    zo = z.clone()
                    zo[:, c] = -torch.inf
                    margin = (z[:, c] - zo.amax(1))[other[c]].min()
                    best[n, c] = max(best[n, c], float(margin))
    finally:
        h.remove()
    return best.max(0), best.argmax(0)


def runs(root: dict[str, Path], ds: str, group: str) -> Path:
    """The bench run holding the group's models: rgb clean-label (and WaNet) as made to work in the third round."""
    return root["strong"] if ds == "rgb" and group in ("clean_label", "wanet") else root["saved"]


def load(run: Path, rid: str) -> tuple[nn.Module, int | None]:
    """A saved bench model and its attack's target class (None for a clean model)."""
    cfg = BackdoorStudyConfig.model_validate_json((run / "config.json").read_text())
    ds, attack, seed = rid.split("|")
    rc = run_config(cfg, ds, None if attack == "clean" else attack, int(seed))
    data = load_data(rc.data)
    model = build_model(rc.model, data.input_shape, data.num_classes)
    model.load_state_dict(load_state_dict(run_folder(run, rid) / "model.safetensors")[0])
    return model.eval(), (rc.attack.target if rc.attack is not None else None)


class Linear(CleanReference):
    """CleanReference on a linear scale (the stimulation margin can be ≤ 0; the log would not exist)."""

    def _oriented(self, s: np.ndarray) -> np.ndarray:
        return np.asarray(s, dtype=np.float64)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--saved", default="runs/backdoor_saved", help="bench run (config.json, models/) of round 3")
    ap.add_argument("--strong", default="runs/backdoor_rgb_strong", help="its rgb clean-label / WaNet run")
    ap.add_argument("--datasets", default="digits,rgb")
    ap.add_argument("--attacks", default="clean_label,badnets,blend,wanet")
    ap.add_argument("--images", type=int, default=100)
    ap.add_argument("--scale", type=float, default=3.0)
    ap.add_argument("--layer", choices=("last_conv", "penultimate"), default="last_conv")
    ap.add_argument("--alpha", type=float, default=0.05)
    ap.add_argument("--out", default="runs/bench/backdoor_stimulation")
    args = ap.parse_args()
    torch.set_num_threads(1)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    root = {"saved": Path(args.saved), "strong": Path(args.strong)}
    stats: dict[str, Any] = {}
    cache = out / "stats.json"  # per model, so an interrupted run resumes
    if cache.exists():
        stats = json.loads(cache.read_text())
    rows = []
    for ds in args.datasets.split(","):
        data = load_data(DATA[ds])
        for group in ["clean", *args.attacks.split(",")]:
            for seed in range(10):
                key = f"{ds}|{group}|{seed}"
                if key in stats:
                    continue
                model, tgt = load(runs(root, ds, group), key)
                (xd, yd), _ = defender_split(data, seed)
                t0 = time.perf_counter()
                s, ch = stimulation(model, xd[: args.images], yd[: args.images], data.num_classes, scale=args.scale,
                                    where=args.layer)
                stats[key] = {"per_class": s.tolist(), "channel": ch.tolist(), "target": tgt, "seconds": time.perf_counter() - t0}
                cache.write_text(json.dumps(stats))
                print(key, np.round(s, 2).tolist(), flush=True)
        clean = {int(k.split("|")[2]): v["per_class"] for k, v in stats.items() if k.startswith(f"{ds}|clean|")}
        for group in ["clean", *args.attacks.split(",")]:
            found = target = 0
            ps = []
            for seed in range(10):
                key = f"{ds}|{group}|{seed}"
                if key not in stats:
                    continue
                refs = [v for s, v in clean.items() if s != seed]  # never the evaluated model (nor its seed)
                cal = Linear("mmbd", refs, args.alpha)
                p, k = cal.p_value(stats[key]["per_class"])
                ps.append(round(p, 4))
                found += p < args.alpha
                target += p < args.alpha and k == stats[key]["target"]
            rows.append({"dataset": ds, "models": group, "scale": args.scale, "layer": args.layer, "flagged": found, "flagged_on_target": target, "n": len(ps),
                         "p": ps})
            print(rows[-1], flush=True)
    (out / "summary.json").write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
