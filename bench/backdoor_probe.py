"""Probe (issue 41, sixth round): trigger-shape-free per-class statistics on saved models, before choosing one.

Per class c, on the defender's clean images x with y(x) ≠ c:
  dist   — median log L2 distance to class c found by a targeted DeepFool iteration (smaller = suspicious)
  uap    — mean clipped margin toward c under one universal L∞ perturbation (ε = 0.1 of the box; larger = suspicious)
  adv    — share of untargeted L2 PGD adversarial examples landing in c (larger = suspicious)
  anp    — share of clean inputs predicted c under adversarial multiplicative neuron noise (ε = 0.3; larger = ...)
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

sys.path.insert(0, str(Path(__file__).parent))
from backdoor_stimulation import DATA  # noqa: E402

from modelward.backdoor.experiment import defender_split  # noqa: E402
from modelward.backdoor.study import BackdoorStudyConfig, run_config, run_folder  # noqa: E402
from modelward.core.data import load_data  # noqa: E402
from modelward.core.io import load_state_dict  # noqa: E402
from modelward.core.zoo import build_model  # noqa: E402


def margin_to(z: torch.Tensor, c: int) -> torch.Tensor:
    zo = z.clone()
    zo[:, c] = -torch.inf
    return z[:, c] - zo.amax(1)


def deepfool_dist(model: nn.Module, x: torch.Tensor, c: int, iters: int = 20, overshoot: float = 0.02) -> torch.Tensor:
    """Targeted DeepFool toward c: L2 distance reached (inf where it did not get there)."""
    xa = x.clone()
    done = torch.zeros(len(x), dtype=torch.bool)
    for _ in range(iters):
        xa.requires_grad_(True)
        z = model(xa)
        m = margin_to(z, c)  # < 0 until c is the top class
        done = done | (m.detach() > 0)
        if bool(done.all()):
            break
        g, = torch.autograd.grad(m.sum(), xa)
        with torch.no_grad():
            gn = g.flatten(1).norm(dim=1).clamp_min(1e-12)
            step = ((-m).clamp_min(0) + 1e-4) / gn ** 2 * (1 + overshoot)
            step = torch.where(done, torch.zeros_like(step), step)
            xa = (xa + step.view(-1, *[1] * (x.dim() - 1)) * g).detach()
    with torch.no_grad():
        ok = margin_to(model(xa), c) > 0
        d = (xa - x).flatten(1).norm(dim=1)
    return torch.where(ok, d, torch.full_like(d, float("inf")))


def uap_margin(model: nn.Module, x: torch.Tensor, c: int, eps: float, steps: int = 60) -> float:
    delta = torch.zeros(1, *x.shape[1:], requires_grad=True)
    opt = torch.optim.Adam([delta], lr=eps / 10)
    for _ in range(steps):
        z = model((x + delta).clamp(0, 1))
        loss = -margin_to(z, c).clamp(max=5.0).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        with torch.no_grad():
            delta.clamp_(-eps, eps)
    with torch.no_grad():
        return float(margin_to(model((x + delta).clamp(0, 1)), c).clamp(max=5.0).mean())


def untargeted_landing(model: nn.Module, x: torch.Tensor, y: torch.Tensor, k: int, eps: float,
                       steps: int = 20) -> np.ndarray:
    xa = x.clone()
    alpha = 2.5 * eps / steps
    for _ in range(steps):
        xa.requires_grad_(True)
        loss = nn.functional.cross_entropy(model(xa), y)
        g, = torch.autograd.grad(loss, xa)
        with torch.no_grad():
            g = g / g.flatten(1).norm(dim=1).clamp_min(1e-12).view(-1, *[1] * (x.dim() - 1))
            xa = xa + alpha * g
            d = xa - x
            n = d.flatten(1).norm(dim=1).clamp_min(1e-12)
            d = d * (eps / n).clamp(max=1.0).view(-1, *[1] * (x.dim() - 1))
            xa = (x + d).clamp(0, 1).detach()
    with torch.no_grad():
        p = model(xa).argmax(1)
    flipped = p != y
    return np.bincount(p[flipped].numpy(), minlength=k) / max(int(flipped.sum()), 1)


def anp_share(model: nn.Module, x: torch.Tensor, y: torch.Tensor, k: int, eps: float, steps: int = 10) -> np.ndarray:
    """Adversarial multiplicative noise on every conv/linear output channel (ANP, Wu & Wang 2021); prediction shares."""
    layers = [m for m in model.modules() if isinstance(m, (nn.Conv2d, nn.Linear))][:-1]
    noise = [torch.zeros(m.out_channels if isinstance(m, nn.Conv2d) else m.out_features, requires_grad=True)
             for m in layers]
    hooks = []
    for m, n in zip(layers, noise, strict=True):
        def hook(mod: nn.Module, i: Any, o: torch.Tensor, n: torch.Tensor = n) -> torch.Tensor:
            shape = [1, -1] + [1] * (o.dim() - 2)
            return o * (1 + n.view(*shape))
        hooks.append(m.register_forward_hook(hook))
    try:
        for n in noise:
            with torch.no_grad():
                n.uniform_(-eps, eps)
        for _ in range(steps):
            loss = nn.functional.cross_entropy(model(x), y)
            gs = torch.autograd.grad(loss, noise)
            with torch.no_grad():
                for n, g in zip(noise, gs, strict=True):
                    n.add_(eps / 4 * g.sign()).clamp_(-eps, eps)
        with torch.no_grad():
            p = model(x).argmax(1)
    finally:
        for h in hooks:
            h.remove()
    wrong = p != y
    return np.bincount(p[wrong].numpy(), minlength=k) / max(int(wrong.sum()), 1)


def stats_of(model: nn.Module, x: torch.Tensor, y: torch.Tensor, k: int, a: argparse.Namespace) -> dict[str, list[float]]:
    out: dict[str, list[float]] = {"dist": [], "uap": []}
    for c in range(k):
        xo = x[y != c]
        d = deepfool_dist(model, xo, c)
        out["dist"].append(float(torch.log(d.clamp_min(1e-6)).median()))
        out["uap"].append(uap_margin(model, xo, c, a.uap_eps))
    out["adv"] = untargeted_landing(model, x, y, k, a.adv_eps).tolist()
    torch.manual_seed(0)
    out["anp"] = anp_share(model, x, y, k, a.anp_eps).tolist()
    return out


def model_list(a: argparse.Namespace) -> list[tuple[str, Path, str, str | None, int]]:
    """(key, weights file, dataset, attack, seed)."""
    rows = []
    saved, strong = Path(a.saved), Path(a.strong)
    for ds in a.datasets.split(","):
        for group in ["clean", "clean_label", "badnets", "blend", "wanet"]:
            run = strong if ds == "rgb" and group in ("clean_label", "wanet") else saved
            for s in range(10):
                rid = f"{ds}|{group}|{s}"
                rows.append((f"saved|{rid}", run_folder(run, rid) / "model.safetensors", ds,
                             None if group == "clean" else group, s))
    for folder in a.fresh.split(","):
        if not folder:
            continue
        for f in sorted(Path(folder).glob("*.safetensors")):
            ds, rest = f.stem.split("_", 1)
            att, seed = rest.rsplit("_", 1)
            rows.append((f"fresh|{ds}|{att}|{seed}", f, ds, None if att == "clean" else att, int(seed)))
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--saved", default="runs/bench/backdoor_saved")
    ap.add_argument("--strong", default="runs/bench/backdoor_rgb_strong")
    ap.add_argument("--fresh", default="")
    ap.add_argument("--datasets", default="digits,rgb")
    ap.add_argument("--images", type=int, default=100)
    ap.add_argument("--uap-eps", type=float, default=0.1)
    ap.add_argument("--adv-eps", type=float, default=1.0)
    ap.add_argument("--anp-eps", type=float, default=0.3)
    ap.add_argument("--only", default="", help="comma-separated key prefixes")
    ap.add_argument("--out", default="runs/bench/backdoor_probe/stats.json")
    a = ap.parse_args()
    torch.set_num_threads(1)
    out = Path(a.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    stats: dict[str, Any] = json.loads(out.read_text()) if out.exists() else {}
    cfg = BackdoorStudyConfig.model_validate_json((Path(a.saved) / "config.json").read_text())
    cfg_strong = BackdoorStudyConfig.model_validate_json((Path(a.strong) / "config.json").read_text())
    datas = {ds: load_data(DATA[ds]) for ds in a.datasets.split(",")}
    for key, f, ds, att, seed in model_list(a):
        if key in stats or (a.only and not any(key.startswith(p) for p in a.only.split(","))):
            continue
        if not f.is_file():
            continue
        c = cfg_strong if (ds == "rgb" and att in ("clean_label", "wanet") and key.startswith("saved")) else cfg
        rc = run_config(c, ds, att, seed)
        data = datas[ds]
        model = build_model(rc.model, data.input_shape, data.num_classes)
        model.load_state_dict(load_state_dict(f)[0])
        model.eval()
        (xd, yd), _ = defender_split(data, seed)
        t0 = time.perf_counter()
        s = stats_of(model, xd[: a.images], yd[: a.images], data.num_classes, a)
        s["target"] = rc.attack.target if rc.attack is not None else None
        s["seconds"] = time.perf_counter() - t0
        stats[key] = s
        out.write_text(json.dumps(stats))
        print(key, s["target"], {m: int(np.argmax(v) if m != "dist" else np.argmin(v)) for m, v in s.items()
                                 if isinstance(v, list)}, f"{s['seconds']:.1f}s", flush=True)


if __name__ == "__main__":
    main()
