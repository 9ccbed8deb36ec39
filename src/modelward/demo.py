"""`modelward demo`: the main job on embedded defaults (digits, small CNN), in a few minutes on 2 CPU cores.

1. Shared governance: the CNN is trained split between two parties (Alice: conv1 and the inputs; Bob: the rest and
   the labels) over gRPC with mutual TLS on 127.0.0.1, every pass consented and audited.
2. Completion hardness: that trained model is seed 0 of a completion study — every part reset and retrained with
   T1 and T2 (α ∈ {0.5, 0.8, 0.9, 1.0}, 3 seeds) — including "Bob's part" (what Alice would have to rebuild to
   use the model without Bob) and conv1 ("Alice's part"), next to the from-scratch reference T0 (2 seeds, to keep
   the demo short). Thresholds are measured on a validation split held out from training (20 %).
3. Extraction defense: the model is served behind a ModelGuard-S guarded prediction API and attacked.
4. Security report: `modelward assess` (quick profile) on the split-trained model — robustness, privacy,
   extraction, the split's completion hardness (read from step 2) and explanations/bias — as one self-contained
   report.html.
Re-running the same command resumes: finished work is kept.
"""

from __future__ import annotations

import importlib.util
import tomllib
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.rule import Rule

from modelward.assess import AssessConfig, SplitConfig, run_assessment
from modelward.completion.problem import OriginalRun
from modelward.completion.report import rich_tables
from modelward.completion.study import StudyConfig, make_problem, orig_id, run_study
from modelward.core.config import validate
from modelward.core.init import init_model_
from modelward.core.io import load_into, load_state_dict, save_state_dict
from modelward.core.ledger import RunLedger
from modelward.core.progress import RichProgress
from modelward.core.seed import seeded

DEMO_STUDY = """
name = "demo-digits-cnn"
kind = "supervised"
seeds = [0, 1, 2]
alphas = [0.5, 0.8, 0.9, 1.0]
parts = ["conv1", "conv2", "fc1", "logits", "conv2+fc1+logits"]
early_stop = true
reference_seeds = [0, 1]        # T0 (from scratch) on 2 of the 3 seeds: it costs a full training run each

[[procedures]]
name = "T1"
kind = "T1"

[[procedures]]
name = "T2"
kind = "T2"

[data]
source = "digits"
test_fraction = 0.25
seed = 0

[model]
arch = "cnn"
channels = [16, 32]
fc = 64

[train]
optimizer = "sgd"
lr = 0.02
momentum = 0.9
weight_decay = 1e-4
batch_size = 32
steps = 600
lr_schedule = [[0, 0.02], [400, 0.002]]
eval_every = 5
loss = "error"

[retrain]
lr_schedule = [[0, 0.02], [200, 0.002]]
"""

ALICE_PART = "conv1"
BOB_PART = "conv2+fc1+logits"


def demo_study_config(quick: bool = False) -> Any:
    data = tomllib.loads(DEMO_STUDY)
    if quick:  # a smoke-test size for the test suite
        data.update(seeds=[0], alphas=[0.5, 1.0], parts=[ALICE_PART, BOB_PART], reference_seeds=[0])
        data["train"].update(steps=120, lr_schedule=[[0, 0.05]], eval_every=10)
        data["retrain"] = {}
    return validate(StudyConfig, data, "demo defaults")


def _available(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except ModuleNotFoundError:
        return False


def run_demo(out: str | Path, console: Console | None = None, quick: bool = False,
             workers: int | None = None) -> dict[str, Any]:
    """Run the three demo steps into `out`; returns a summary dict."""

    console = console or Console()
    out = Path(out).resolve()
    out.mkdir(parents=True, exist_ok=True)
    cfg = demo_study_config(quick)
    problem = make_problem(cfg)
    data = problem.data
    summary: dict[str, Any] = {"data": data.describe()}
    console.print(Rule("modelward demo"))
    console.print(f"data: {data.describe()}; model: small CNN, parts {problem.part_names()}")

    # 1. split training between two parties -------------------------------------------------------------------
    study_dir = out / "completion"
    ledger_path = study_dir / "ledger.sqlite"
    presets: list[OriginalRun] = []
    already = ledger_path.exists() and RunLedger(ledger_path).status(orig_id("", 0)) == "done"
    if already:
        console.print("[dim]step 1 (split training) already done — resuming[/]")
    elif _available("modelward.governance.demo"):
        # lazy: step 1 runs only where the governance area is installed (_available above)
        from modelward.governance.demo import run_split_demo

        console.print(Rule("1 · shared governance: split training over gRPC + mutual TLS"))
        model = init_model_(problem.build(), "glorot_uniform", 0)
        with seeded(0):
            # trained on what the study's originals train on, its curve on the split the thresholds use
            res = run_split_demo(out / "split", model, problem.fit_split(), cfg.train, 0, console, cut=ALICE_PART)
        ckpt = study_dir / "checkpoints" / "original_seed0_split.safetensors"
        save_state_dict(ckpt, res.state_dict, {"seed": 0, "trained": "split between parties"})
        presets.append(OriginalRun(0, "", [(int(s), float(v)) for s, v in res.curve], ckpt,
                                   {"split": True, "party_params": res.party_params}))
        summary["split"] = res.summary
        console.print(f"parties: { {p: len(v) for p, v in res.party_params.items()} } parameter tensors; "
                      f"split-trained validation error {res.curve[-1][1]:.3f}")

    # 2. completion study ----------------------------------------------------------------------------------------
    console.print(Rule("2 · model-completion hardness (T1, T2, reference T0; seed 0 = the split-trained model)"))

    with RichProgress(console) as progress:
        outcome = run_study(cfg, study_dir, progress, workers=workers, preset_originals=presets)
    for table in rich_tables(cfg, outcome.tables):
        console.print(table)
    summary["completion"] = {"out": str(study_dir), "done": outcome.done, "total": outcome.total,
                             "failed": len(outcome.failed)}
    console.print(f"'{ALICE_PART}' is Alice's part (Bob must complete it); '{BOB_PART}' is Bob's part "
                  "(Alice must complete it).")
    console.print(f"tables: {study_dir / 'hardness.md'}   plots: {study_dir}/hardness_T1.png, hardness_T2.png")

    # 3. guarded prediction API vs extraction --------------------------------------------------------------------
    if _available("modelward.extraction.demo"):
        # lazy: step 3 runs only where the extraction area is installed (_available above)
        from modelward.extraction.demo import run_extraction_demo

        console.print(Rule("3 · extraction defense: ModelGuard-S behind a guarded prediction API"))
        model = problem.build()
        orig = RunLedger(ledger_path).results()[orig_id("", 0)]
        state, _ = load_state_dict(study_dir / orig["checkpoint"])
        load_into(model, state, study_dir / orig["checkpoint"])
        model.eval()
        summary["extraction"] = run_extraction_demo(out / "extraction", model, cfg.model, data, console, seed=0)

    # 4. one security report for the model ---------------------------------------------------------------------------
    summary["report"] = str(_assess(out, cfg, study_dir, ledger_path, console, quick, workers))
    console.print(Rule("done"))
    console.print(f"everything is in {out}/")
    console.print(f"security report: [bold]{summary['report']}[/]")
    return summary


def _assess(out: Path, cfg: Any, study_dir: Path, ledger_path: Path, console: Console, quick: bool,
            workers: int | None) -> Path:
    """Step 4: `modelward assess` on the split-trained model (seed 0's original), reusing step 2's study."""
    import json

    console.print(Rule("4 · security report: every threat on the split-trained model"))
    orig = RunLedger(ledger_path).results()[orig_id("", 0)]
    state, _ = load_state_dict(study_dir / orig["checkpoint"])
    ckpt = out / "model.safetensors"
    save_state_dict(ckpt, state, {"model": cfg.model.model_dump(mode="json"), "data": cfg.data.model_dump(mode="json"),
                                  "trained": "split between parties (demo step 1)"})
    sections = ["robustness", "completion", "explanations"] if quick else \
        ["robustness", "privacy", "extraction", "completion", "explanations"]
    acfg = AssessConfig(name="demo digits CNN (split-trained)", checkpoint=str(ckpt), train=cfg.train,
                        profile="quick", sections=sections,
                        split=SplitConfig(parties={"alice": [ALICE_PART], "bob": BOB_PART.split("+")},
                                          study=str(study_dir)))
    with RichProgress(console) as progress:
        run_assessment(acfg, out / "report", workers=min(2, workers or 2), progress=progress)
    for s in json.loads((out / "report" / "report.json").read_text())["sections"]:
        head = s["headline"]["text"] + " — " + s["headline"]["label"] if s.get("headline") else s["reason"]
        console.print(f"  {s['title']}: [bold]{s['verdict']}[/] ({head})", highlight=False)
    return out / "report" / "report.html"
