"""The assess backdoor section with clean references (``[backdoor] reference``) on the bench's saved digits models
(issue 41, fourth round): the section is run on the 10 clean models (each writes ``backdoor/detect.json`` at the quick
profile's settings), then every evaluated model's section uses the clean models of the *other* seeds as references
(leave-one-out: never itself). Prints the card's verdict and deciding rule per model, and the counts.

    OMP_NUM_THREADS=1 nice -n 10 .venv/bin/python -W ignore bench/backdoor_assess_reference.py --eval-seeds 3
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch

from modelward.assess.config import AssessConfig
from modelward.assess.profiles import PROFILES
from modelward.assess.sections import backdoor as section
from modelward.assess.target import Target
from modelward.backdoor.study import BackdoorStudyConfig, run_config
from modelward.core.data import load_data

sys.path.insert(0, str(Path(__file__).parent))
from backdoor_stimulation import load  # noqa: E402 - the bench scripts are not a package


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--saved", default="runs/backdoor_saved")
    ap.add_argument("--dataset", default="digits")
    ap.add_argument("--attacks", default="badnets,clean_label")
    ap.add_argument("--seeds", type=int, default=10, help="clean reference models (seeds 0..)")
    ap.add_argument("--eval-seeds", type=int, default=10, help="models evaluated per group (seeds 0..)")
    ap.add_argument("--out", default="runs/bench/backdoor_assess_reference")
    args = ap.parse_args()
    torch.set_num_threads(1)
    run, out = Path(args.saved), Path(args.out)
    cfg_run = BackdoorStudyConfig.model_validate_json((run / "config.json").read_text())
    data = load_data(run_config(cfg_run, args.dataset, None, 0).data)

    def assess(group: str, seed: int, refs: list[str]) -> dict:
        folder = out / f"{group}_{seed}"
        done = folder / "backdoor" / "section.json"
        if done.exists() and refs:
            return json.loads(done.read_text())
        model, target = load(run, f"{args.dataset}|{group}|{seed}")
        cfg = AssessConfig(checkpoint="unused.safetensors", sections=["backdoor"], seed=seed,
                           backdoor={"reference": refs})
        (folder / "backdoor").mkdir(parents=True, exist_ok=True)
        res = section.run(cfg, Target(model, data, lambda: model, None, None, "zoo", "bench CNN"),
                          PROFILES["quick"], folder / "backdoor", folder).to_dict()
        res["target"] = target
        if refs:
            done.write_text(json.dumps(res))
        return res

    for s in range(args.seeds):  # the references: every clean model's detect.json at the quick profile
        if not (out / f"clean_{s}" / "ref" / "backdoor" / "detect.json").exists():
            model, _ = load(run, f"{args.dataset}|clean|{s}")
            cfg = AssessConfig(checkpoint="unused.safetensors", sections=["backdoor"], seed=s)
            f = out / f"clean_{s}" / "ref" / "backdoor"
            f.mkdir(parents=True, exist_ok=True)
            section.run(cfg, Target(model, data, lambda m=model: m, None, None, "zoo", "bench CNN"),
                        PROFILES["quick"], f, f.parent)
    rows = []
    for group in ["clean", *args.attacks.split(",")]:
        verdicts = []
        for s in range(args.eval_seeds):
            refs = [str(out / f"clean_{r}" / "ref" / "backdoor") for r in range(args.seeds) if r != s]
            res = assess(group, s, refs)
            verdicts.append(res["verdict"])
            print(group, s, res["verdict"], res["headline"]["text"], "|", res["rule"][:60], flush=True)
        rows.append({"models": group, "red": verdicts.count("red"), "amber": verdicts.count("amber"),
                     "green": verdicts.count("green")})
        print(rows[-1], flush=True)
    (out / "summary.json").write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
