"""One-run DP audit (Steinke, Nasr & Jagielski 2023) on digits at ε = 4: honest vs deliberately broken runs.

For each seed, two DP-SGD trainings with the same config (examples/privacy_dp_audit.toml): the honest one, and a
broken one that trains with σ / 4 while the claim (the accountant) keeps σ. Each is audited with its canaries; the
targets are ε_lb ≤ claimed ε in ≥ 19 of 20 honest seeds and ε_lb > claimed ε in ≥ 18 of 20 broken seeds
(white-box canaries). Stops starting new seeds once ``--budget-s`` has passed and says how many ran.
Run: ``OMP_NUM_THREADS=1 PYTHONPATH=src python bench/dp_audit.py [--seeds 20] [--first-seed 0] [--budget-s 1500]
[--json out.json]``.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

from modelward.core.config import load_config
from modelward.privacy.dp_audit import DPAuditConfig, run_dp_audit

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "privacy_dp_audit.toml"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--seeds", type=int, default=20)
    ap.add_argument("--first-seed", type=int, default=0, help="continue a series: seeds first-seed, …")
    ap.add_argument("--budget-s", type=float, default=1500.0)
    ap.add_argument("--divisor", type=float, default=4.0)
    ap.add_argument("--config", type=Path, default=EXAMPLE)
    ap.add_argument("--json", type=Path, default=None)
    a = ap.parse_args()
    base = load_config(a.config, DPAuditConfig)
    start = time.perf_counter()
    runs = []
    for seed in range(a.first_seed, a.first_seed + a.seeds):
        if time.perf_counter() - start > a.budget_s:
            break
        for kind, div in (("honest", 1.0), ("broken", a.divisor)):
            t0 = time.perf_counter()
            rows = run_dp_audit(base.model_copy(update={"seed": seed, "noise_divisor": div}))
            secs = time.perf_counter() - t0
            for r in rows:
                runs.append({"run": kind, "seconds": secs} | r.as_dict())
                print(f"seed {seed:2d} {kind:6s} {r.variant:9s} claimed ε {r.claimed_epsilon:.3f} ({r.accountant}) "
                      f"ε_lb {r.epsilon_lb:.3f} ({r.correct}/{r.guesses}, k={r.k}) acc {r.test_accuracy:.3f} "
                      f"{secs:.1f} s", flush=True)
    total = time.perf_counter() - start
    print(f"\n{len({r['seed'] for r in runs})} seeds in {total:.0f} s ({total / max(len(runs) / 2, 1):.1f} s per "
          "audited training incl. both canary sets)")
    summary = {}
    for variant in sorted({r["variant"] for r in runs}):
        for kind in ("honest", "broken"):
            sel = [r for r in runs if r["variant"] == variant and r["run"] == kind]
            above = sum(r["epsilon_lb"] > r["claimed_epsilon"] for r in sel)
            lbs = sorted(r["epsilon_lb"] for r in sel)
            summary[f"{variant}/{kind}"] = {"seeds": len(sel), "epsilon_lb_above_claim": above,
                                            "min": lbs[0], "median": lbs[len(lbs) // 2], "max": lbs[-1]}
            print(f"{variant:9s} {kind:6s}: ε_lb > claimed ε in {above}/{len(sel)} seeds; ε_lb min/median/max "
                  f"{lbs[0]:.2f} / {lbs[len(lbs) // 2]:.2f} / {lbs[-1]:.2f}")
    if a.json:
        a.json.write_text(json.dumps({"summary": summary, "runs": runs, "seconds": total}, indent=1))


if __name__ == "__main__":
    main()
