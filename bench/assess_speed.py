"""How long `modelward assess` takes on a model: each section's planned work and estimate per profile, and (with
--run) the quick profile run for real, its actual time per section next to the estimate.

Planned work is counted in point-gradients (one forward + backward pass of one input) by the sections' own plan
functions; the estimate multiplies it by the seconds per point-gradient measured here on one batch of 64. The quick
profile applies its compute budget (fewer points on a large model, stated); standard and thorough run everything.

    python bench/assess_speed.py examples/assess_torchvision_resnet18.toml          # plans of quick/standard/thorough
    python bench/assess_speed.py examples/assess_torchvision_resnet18.toml --run    # + the quick profile, timed

(for the torchvision example: `.venv-vision/bin/python`, after its prepare.py). Prints one table per profile and, with
--run, the measured seconds per section and their ratio to the estimate.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from modelward.assess.config import AssessConfig
from modelward.assess.profiles import BUDGET_FLOORS, PROFILES
from modelward.assess.sections import explanations, extraction, privacy, robustness
from modelward.assess.sections.common import fit_budget, forward_flops, seconds_per_point_gradient
from modelward.assess.target import load_target
from modelward.core.config import load_config


def plans(cfg: AssessConfig, profile: str) -> dict[str, tuple[int, str]]:
    """Per section: (planned point-gradients, the budget's note) for `profile`."""
    target = load_target(cfg)
    d = target.data
    sizes = PROFILES[profile]
    fpu = 3 * forward_flops(target.model, d.x_test)
    out: dict[str, tuple[int, str]] = {}
    if "robustness" in cfg.sections and not d.is_text:
        _, linf, l2, *_ = robustness.threat_models(target, sizes, cfg)
        _, w, note, _ = robustness.fit_sizes(cfg, target, sizes, linf, l2)
        out["robustness"] = (sum(x.units for x in w), note)
    if "privacy" in cfg.sections:
        _, w, note = privacy.fit_sizes(cfg.model_copy(update={"profile": profile}), target, sizes)
        out["privacy"] = (sum(x.units for x in w), note)
    if "extraction" in cfg.sections:
        _, w, note = fit_budget("extraction", sizes, cfg.sizes, lambda s: extraction.plan(cfg, s), fpu,
                                BUDGET_FLOORS["extraction"])
        out["extraction"] = (sum(x.units for x in w), note)
    if "explanations" in cfg.sections:
        _, w, note = fit_budget("explanations", sizes, cfg.sizes, lambda s: explanations.plan(target, s), fpu,
                                BUDGET_FLOORS["explanations"])
        out["explanations"] = (sum(x.units for x in w), note)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("config", type=Path)
    ap.add_argument("--run", action="store_true", help="also run the quick profile and time it")
    a = ap.parse_args()
    cfg = load_config(a.config, AssessConfig).resolve_paths(a.config.resolve().parent)
    target = load_target(cfg)
    spu = seconds_per_point_gradient(target.model, target.data.x_test, target.data.y_test)
    fpu = 3 * forward_flops(target.model, target.data.x_test)
    print(f"{target.description}\nmeasured {1000 * spu:.2f} ms per point-gradient; {fpu / 1e9:.3g} GFLOP each")
    estimates: dict[str, float] = {}
    for profile in ("quick", "standard", "thorough"):
        print(f"\nprofile {profile}")
        print(f"{'section':14s} {'point-gradients':>16s} {'TFLOP':>8s} {'estimate':>10s}  reduction")
        for sec, (units, note) in plans(cfg.model_copy(update={"profile": profile}), profile).items():
            est = units * spu
            if profile == "quick":
                estimates[sec] = est
            print(f"{sec:14s} {units:16,d} {units * fpu / 1e12:8.2f} {est / 60:8.1f} m  {note or '-'}")
    if not a.run:
        return
    out = Path(tempfile.mkdtemp(prefix="assess-speed-")) / "out"
    t0 = time.perf_counter()
    subprocess.run([sys.executable, "-m", "modelward.cli.main", "assess", str(a.config), "--out", str(out),
                    "--profile", "quick"], check=True, stdout=subprocess.DEVNULL)
    wall = time.perf_counter() - t0
    timing = json.loads((out / "report.json").read_text())["timing"]
    print(f"\nquick profile, run: {wall / 60:.1f} min in all (imports, preflight and report included); {out}")
    for sec, seconds in timing.items():
        est = estimates.get(sec)
        ratio = f"{seconds / est:.2f}" if est else "-"
        print(f"{sec:14s} took {seconds / 60:6.1f} min, estimated {(est or 0) / 60:6.1f} min, ratio {ratio}")


if __name__ == "__main__":
    main()
